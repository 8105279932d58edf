"""The pure steps of shaping/video: the cut (keyframes, shot changes, caps) and segments."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from deploy.keyframes import read_label
from deploy.videos import Scene, make_video
from shaping.video import (
    FrameVerdict,
    Sampling,
    VideoDecodeFailed,
    VideoLimits,
    cut_keyframes,
    merge_segments,
)

LIMITS = VideoLimits(max_bytes=1 << 26, max_duration_s=600, max_pixels=1 << 24)


def test_keyframes_only_decodes_just_the_streams_keyframes() -> None:
    video = make_video([Scene("allow", 4, seed=1)], fps=4, keyframe_every_s=1)
    cut = cut_keyframes(video, LIMITS, Sampling(max_fps=10, scene_threshold=0, max_frames=64), budget_s=30)
    assert [frame.timestamp_ms for frame in cut.frames] == [0, 1000, 2000, 3000]
    assert cut.decoded == 4  # of 16 frames: the codec skipped the others


def test_a_shot_change_between_keyframes_is_cut_too() -> None:
    video = make_video([Scene("allow", 1.5, seed=1), Scene("block:hate", 1.5, seed=2)], fps=4,
                       keyframe_every_s=10, keyframes_at_cuts=False)
    cut = cut_keyframes(video, LIMITS, Sampling(max_fps=10, scene_threshold=0.05, max_frames=64), budget_s=30)
    assert [(frame.timestamp_ms, frame.reason) for frame in cut.frames] == [(0, "keyframe"), (1500, "scene")]


def test_a_frame_cut_from_h264_still_reads_its_label() -> None:
    video = make_video([Scene("block:violence", 1, seed=2)])
    cut = cut_keyframes(video, LIMITS, Sampling(), budget_s=30)
    assert str(read_label(Image.open(io.BytesIO(cut.frames[0].jpeg)))) == "block:violence"


def test_max_frames_keeps_an_even_spread() -> None:
    video = make_video([Scene("allow", 9, seed=1)], fps=2)
    cut = cut_keyframes(video, LIMITS, Sampling(max_fps=10, scene_threshold=0, max_frames=3), budget_s=30)
    assert [frame.timestamp_ms for frame in cut.frames] == [0, 4000, 8000]


def test_bytes_that_are_no_container_fail_to_decode() -> None:
    with pytest.raises(VideoDecodeFailed):
        cut_keyframes(b"\x00" * 4096, LIMITS, Sampling(), budget_s=30)


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
