"""Cut a video into the frames to judge: every frame decoded, covered on the clock and at shot changes.

Every frame is decoded (an inter frame needs those before it, and the encoder, that is the uploader, must
not decide what the gateway sees). Each is checked as it comes: its timestamp against the duration limit,
its size against the pixel limit, the count against the decoded-frame cap, the clock against the budget.
Shot changes come from FFmpeg's ``scdet`` (shaping/video/scenes.py); which frames are covered, and which
of those reuse a look-alike's verdict, is shaping/video/coverage.py. A judged frame is answered as JPEG
bytes with its ``timestamp_ms`` on the stream's clock: a full-size JPEG by default, or whatever the caller's
``encode`` makes of the picture (the gateway's: the picture shaped onto the token grid, where it is decoded).
More distinct frames than ``max_frames`` fail the cut (:class:`VideoTooManyFrames`) unless the caller asked
for a sparser sample (``allow_sparser``): then every other judged frame is dropped as often as needed and
the coverage says what was got. Damage (a decode error, a frame marked corrupt, a stream that ends well
before the duration it states) fails the cut: no verdict is given over seconds nobody saw.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING

from shaping.image.identity import frame_identity, identity_scale
from shaping.video.coverage import Coverage, Covered, CutReason, Identity, Likeness, largest_gap
from shaping.video.errors import (
    UnsupportedVideoCodec,
    VideoCutTimeout,
    VideoDecodeFailed,
    VideoTooLarge,
    VideoTooLong,
    VideoTooManyFrames,
)
from shaping.video.probe import (
    VideoInfo,
    VideoLimits,
    VideoSource,
    check_limits,
    is_still_image,
    open_container,
    source_size,
    stream_duration_ms,
    video_stream,
)
from shaping.video.scenes import SceneScores

if TYPE_CHECKING:
    import av
    from PIL import Image

Encode = Callable[["Image.Image"], bytes]
"""A judged frame's picture made into the bytes the cut answers (a JPEG)."""

JPEG_QUALITY = 90
# scdet's score (0..1 here) of a hard cut between two of the synthetic scenes measured 0.059 to 0.18, of
# any one frame of a half- or one-second cross-fade at most 0.0144, of a still shot 0 (docs/engineering.md):
# 0.03 sits at half the weakest cut and twice the strongest fade frame. Fades are covered by the clock.
SCENE_THRESHOLD = 0.03


@dataclass(frozen=True, slots=True)
class Sampling:
    """How a video is covered: the longest gap, shot changes (threshold 0: none; at most ``max_fps`` a
    second), the most distinct frames judged, and whether a sparser sample than the gap may do."""

    max_gap_s: float = 1.0
    scene_threshold: float = SCENE_THRESHOLD
    max_fps: float = 1.0
    max_frames: int = 64
    allow_sparser: bool = False


@dataclass(frozen=True, slots=True)
class CutFrame:
    """One frame to judge: where it is in the video, why it was picked, its JPEG bytes."""

    timestamp_ms: int
    reason: CutReason
    jpeg: bytes


@dataclass(frozen=True, slots=True)
class VideoCut:
    """The cut: what the container said, the frames to judge, every covered frame, and the coverage."""

    info: VideoInfo  # duration_ms: measured from the decoded frames' timestamps
    frames: list[CutFrame]
    covered: list[Covered]
    coverage: Coverage

    @property
    def decoded(self) -> int:
        """Frames decoded for the cut."""
        return self.coverage.frames_decoded


@dataclass
class _Picker:
    """Covers frames as they are decoded (see shaping/video/coverage.py), judging or reusing each."""

    sampling: Sampling
    likeness: Likeness
    encode: Encode
    judged: list[CutFrame]
    looks: list[Identity]
    covered: list[Covered]
    thinned: bool = False

    def take(self, frame: av.VideoFrame, timestamp_ms: int, reason: CutReason) -> None:
        look = _identity(frame)
        for index, other in enumerate(self.looks):
            if self.likeness(look, other):
                self.covered.append(Covered(timestamp_ms, reason, index, reused=True))
                return
        picture = frame.to_image()  # type: ignore[no-untyped-call]  # PyAV's stub leaves it untyped
        if frame.rotation:  # as it is displayed (counter-clockwise degrees, as FFmpeg's autorotate turns it)
            picture = picture.rotate(frame.rotation, expand=True)
        self.covered.append(Covered(timestamp_ms, reason, len(self.judged), reused=False))
        self.judged.append(CutFrame(timestamp_ms, reason, self.encode(picture)))
        self.looks.append(look)
        if len(self.judged) <= self.sampling.max_frames:
            return
        if not self.sampling.allow_sparser:
            raise VideoTooManyFrames(
                f"covering every {self.sampling.max_gap_s:g} s of the video needs more than "
                f"{self.sampling.max_frames} distinct frames (reached at {timestamp_ms / 1000:.1f} s): "
                "ask for more frames (sampling.max_frames), a longer gap (sampling.max_gap_s), or a sparser "
                "sample (sampling.allow_sparser)"
            )
        self._thin()

    def _thin(self) -> None:
        """Keep every other judged frame (the first kept), and the covered frames that reuse a kept one."""
        kept = list(range(0, len(self.judged), 2))
        renumber = {old: new for new, old in enumerate(kept)}
        self.judged = [self.judged[i] for i in kept]
        self.looks = [self.looks[i] for i in kept]
        self.covered = [replace(c, judged=renumber[c.judged]) for c in self.covered if c.judged in renumber]
        self.thinned = True


def _identity(frame: av.VideoFrame) -> Identity:
    scale = identity_scale((frame.width, frame.height))
    reduced = frame.reformat(
        width=max(1, frame.width // scale), height=max(1, frame.height // scale), format="rgb24"
    ).to_image()  # type: ignore[no-untyped-call]  # PyAV's stub leaves it untyped
    phash, thumbnail = frame_identity(reduced)
    return int(phash, 16), thumbnail


def full_size_jpeg(picture: Image.Image) -> bytes:
    """A judged frame as a JPEG of the size it was decoded at (the default encoding of a cut frame)."""
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def cut_video(
    source: VideoSource,
    limits: VideoLimits,
    sampling: Sampling,
    likeness: Likeness,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    encode: Encode = full_size_jpeg,
) -> VideoCut:
    """The frames of ``source`` to judge and the coverage they give (see the module's docstring); each
    judged frame's picture (as displayed) made into its bytes by ``encode``."""
    import av  # an extra: modgate[video]

    deadline = clock() + budget_s
    size = source_size(source)
    if size > limits.max_bytes:
        raise VideoTooLarge(f"the video is {size:,} bytes, over the {limits.max_bytes:,}-byte limit")
    with open_container(source) as container:
        if is_still_image(container):
            raise UnsupportedVideoCodec(f"the file is a still image ({container.format.name}), not a video")
        stream = video_stream(container)
        codec = stream.codec_context
        stated = VideoInfo(
            container=container.format.name, codec=codec.name, width=codec.width, height=codec.height,
            duration_ms=stream_duration_ms(container, stream), frames=stream.frames,
        )
        check_limits(stated, limits)
        codec.thread_type = "AUTO"
        start = stream.start_time or 0
        time_base = Fraction(stream.time_base) if stream.time_base is not None else Fraction(1, 1000)
        step_ms = 1000 / float(stream.average_rate) if stream.average_rate else 40.0  # no timestamp: guessed
        max_gap_ms = sampling.max_gap_s * 1000
        min_scene_ms = 1000 / sampling.max_fps
        scenes = SceneScores() if sampling.scene_threshold > 0 else None
        picker = _Picker(sampling, likeness, encode, [], [], [])
        decoded_ms: list[int] = []
        end_ms = 0
        last_scene_ms = -min_scene_ms
        previous: tuple[av.VideoFrame, int] | None = None
        try:
            for frame in container.decode(stream):
                if clock() > deadline:
                    raise VideoCutTimeout(f"the video was not cut within {budget_s:g} s")
                if len(decoded_ms) >= limits.max_decoded_frames:
                    raise VideoTooLarge(f"the video has more than {limits.max_decoded_frames:,} frames")
                if frame.is_corrupt:
                    raise VideoDecodeFailed(f"the video is damaged at frame {len(decoded_ms)}")
                if frame.width * frame.height > limits.max_pixels:
                    raise VideoTooLarge(
                        f"the video's frames become {frame.width}x{frame.height} after {len(decoded_ms)} "
                        f"frames, over the {limits.max_pixels:,}-pixel limit"
                    )
                if frame.pts is not None:
                    timestamp_ms = max(0, int((frame.pts - start) * time_base * 1000))
                else:
                    timestamp_ms = int(decoded_ms[-1] + step_ms) if decoded_ms else 0
                timestamp_ms = max(timestamp_ms, decoded_ms[-1] if decoded_ms else 0)  # never backwards
                if timestamp_ms > limits.max_duration_s * 1000:
                    raise VideoTooLong(
                        f"the video runs past the {limits.max_duration_s:g} s limit (decoding stopped there)"
                    )
                duration = frame.duration * time_base * 1000 if frame.duration else step_ms
                end_ms = max(end_ms, int(timestamp_ms + duration))
                decoded_ms.append(timestamp_ms)
                score = scenes.score(frame) if scenes is not None else 0.0
                last = picker.covered[-1].timestamp_ms if picker.covered else None
                if last is None:
                    picker.take(frame, timestamp_ms, "start")
                elif scenes is not None and score >= sampling.scene_threshold \
                        and timestamp_ms - last_scene_ms >= min_scene_ms:
                    picker.take(frame, timestamp_ms, "scene")
                    last_scene_ms = timestamp_ms
                elif timestamp_ms - last > max_gap_ms:
                    if previous is not None and previous[1] > last:
                        picker.take(previous[0], previous[1], "clock")
                    if timestamp_ms - picker.covered[-1].timestamp_ms > max_gap_ms:
                        picker.take(frame, timestamp_ms, "clock")
                previous = (frame, timestamp_ms)
        except av.FFmpegError as exc:
            raise VideoDecodeFailed(
                f"the video is corrupt or truncated after {len(decoded_ms)} decoded frames ({exc})"[:300]
            ) from exc
    if not decoded_ms:
        raise VideoDecodeFailed("no frame of the video could be decoded")
    if stated.duration_ms and stated.duration_ms - end_ms > max(max_gap_ms, 2 * step_ms):
        raise VideoDecodeFailed(
            f"the video's frames end at {end_ms / 1000:.1f} s of the {stated.duration_ms / 1000:.1f} s its "
            "stream states: truncated or damaged"
        )
    covered_ms = [c.timestamp_ms for c in picker.covered]
    coverage = Coverage(
        max_gap_ms=largest_gap(covered_ms, decoded_ms),
        frames_decoded=len(decoded_ms),
        candidates=len(picker.covered),
        judged=len(picker.judged),
        reused=sum(c.reused for c in picker.covered),
        complete=not picker.thinned,
    )
    info = replace(stated, duration_ms=end_ms, frames=len(decoded_ms))
    return VideoCut(info=info, frames=picker.judged, covered=picker.covered, coverage=coverage)
