"""The pure steps of shaping/video: the cut (the clock, shot changes, reuse, caps) and segments."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from PIL import Image

from deploy.evasive_videos import encode, held
from deploy.keyframes import read_label, render_keyframe
from deploy.videos import Scene, make_video
from gateway.jobs.video import likeness
from gateway.moderation.verdict_cache import NearDuplicateRule
from shaping.video import (
    FrameVerdict,
    Sampling,
    VideoDecodeFailed,
    VideoLimits,
    VideoTooLarge,
    VideoTooLong,
    VideoTooManyFrames,
    cut_video,
    merge_segments,
)

LIMITS = VideoLimits(max_bytes=1 << 26, max_duration_s=600, max_pixels=1 << 24)
SAME = likeness(NearDuplicateRule())


def test_a_long_gop_video_is_covered_every_second_though_it_has_one_keyframe() -> None:
    video = make_video([Scene("allow", 4, seed=1)], fps=4, keyframe_every_s=12, keyframes_at_cuts=False)
    cut = cut_video(video, LIMITS, Sampling(), SAME, budget_s=30)
    assert [c.timestamp_ms for c in cut.covered] == [0, 1000, 2000, 3000]
    assert cut.decoded == 16  # every frame: the encoder does not decide what is seen
    assert (cut.coverage.max_gap_ms, cut.coverage.judged, cut.coverage.reused) == (750, 1, 3)


def test_a_hard_cut_between_keyframes_is_judged_and_a_still_shot_reuses_its_first_verdict() -> None:
    video = make_video([Scene("allow", 1.5, seed=1), Scene("block:hate", 1.5, seed=2)], fps=4,
                       keyframe_every_s=10, keyframes_at_cuts=False)
    cut = cut_video(video, LIMITS, Sampling(), SAME, budget_s=30)
    assert [(frame.timestamp_ms, frame.reason) for frame in cut.frames] == [(0, "start"), (1500, "scene")]
    assert [(c.timestamp_ms, c.reason, c.judged, c.reused) for c in cut.covered] == [
        (0, "start", 0, False), (1000, "clock", 0, True), (1500, "scene", 1, False), (2500, "clock", 1, True),
    ]


def test_a_frame_cut_from_h264_still_reads_its_label() -> None:
    video = make_video([Scene("block:violence", 1, seed=2)])
    cut = cut_video(video, LIMITS, Sampling(), SAME, budget_s=30)
    assert str(read_label(Image.open(io.BytesIO(cut.frames[0].jpeg)))) == "block:violence"


def test_more_distinct_frames_than_max_frames_fail_the_cut_rather_than_skip_seconds() -> None:
    video = make_video([Scene("allow", 1, seed=seed) for seed in range(4)], fps=2)
    with pytest.raises(VideoTooManyFrames, match="more than 3 distinct frames"):
        cut_video(video, LIMITS, Sampling(max_frames=3), SAME, budget_s=30)


def test_a_sparser_sample_asked_for_says_the_coverage_it_got() -> None:
    video = make_video([Scene("allow", 1, seed=seed) for seed in range(4)], fps=2)
    cut = cut_video(video, LIMITS, Sampling(max_frames=3, allow_sparser=True), SAME, budget_s=30)
    assert [frame.timestamp_ms for frame in cut.frames] == [0, 2000, 3000]  # 1000 dropped, as 3000 came
    assert (cut.coverage.complete, cut.coverage.max_gap_ms) == (False, 1500)


def test_bytes_that_are_no_container_fail_to_decode() -> None:
    with pytest.raises(VideoDecodeFailed):
        cut_video(b"\x00" * 4096, LIMITS, Sampling(), SAME, budget_s=30)


def test_segments_merge_equal_neighbours_and_end_where_the_next_begins() -> None:
    frames = [
        FrameVerdict(0, 0, "allow", (), 0.9),
        FrameVerdict(1, 1000, "block", ("violence",), 0.8),
        FrameVerdict(2, 2000, "block", ("violence",), 0.7),
        FrameVerdict(3, 3000, "block", ("hate",), None),
    ]
    segments = merge_segments(frames, duration_ms=5000)
    assert [(s.start_ms, s.end_ms, s.action, s.categories, s.frames, s.confidence) for s in segments] == [
        (0, 1000, "allow", (), (0,), 0.9),
        (1000, 3000, "block", ("violence",), (1, 2), 0.7),
        (3000, 5000, "block", ("hate",), (3,), None),
    ]


def test_a_live_matroska_is_measured_by_its_frames_and_decoding_stops_at_the_duration_limit() -> None:
    video = encode(held(render_keyframe("allow", 160, 90, 1), 0, 20, 2), size=(160, 90), container="matroska",
                   container_options={"live": "1"})
    with pytest.raises(VideoTooLong, match="decoding stopped there"):
        cut_video(video, replace(LIMITS, max_duration_s=5), Sampling(), SAME, budget_s=30)
    # the last frame starts at 19.5 s; it lasts what the stream says of it
    assert 19_500 < cut_video(video, LIMITS, Sampling(), SAME, budget_s=30).info.duration_ms <= 20_000


def test_more_frames_than_the_decoded_frame_cap_fail_the_cut() -> None:
    video = make_video([Scene("allow", 3, seed=1)], fps=10)
    with pytest.raises(VideoTooLarge, match="more than 20 frames"):
        cut_video(video, replace(LIMITS, max_decoded_frames=20), Sampling(), SAME, budget_s=30)
