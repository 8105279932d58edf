"""Pick the frames of a video to judge: the stream's own keyframes plus shot changes, capped.

With ``scene_threshold`` 0 only keyframes are decoded (FFmpeg's ``skip_frame`` NONKEY: the codec skips
every other frame, the cheap path). Otherwise every frame is decoded (an inter frame needs those before it)
and shrunk to a small grey thumbnail; a frame whose mean absolute difference from the previous one is at
least ``scene_threshold`` (0..1 of full scale) is a shot change. Candidates are kept in time order when at
least ``1000 / max_fps`` ms after the last kept one; past ``max_frames`` an even spread of them is kept.
Each kept frame is answered as JPEG bytes (the same path as a posted keyframe shapes it next) with its
``timestamp_ms`` on the stream's own clock. The cut stops with :class:`VideoDecodeFailed` past its budget.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

from shaping.video.errors import UnsupportedVideoCodec, VideoDecodeFailed
from shaping.video.probe import (
    VideoInfo,
    VideoLimits,
    check_limits,
    is_still_image,
    open_container,
    stream_duration_ms,
    video_stream,
)

THUMBNAIL = (64, 36)  # width, height of the grey thumbnails shot changes are measured on
JPEG_QUALITY = 90

CutReason = Literal["keyframe", "scene"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """How densely to cut: a rate cap, the shot-change threshold (0: keyframes only), a count cap."""

    max_fps: float = 1.0
    scene_threshold: float = 0.3
    max_frames: int = 64


@dataclass(frozen=True, slots=True)
class CutFrame:
    """One frame to judge: where it is in the video, why it was picked, its JPEG bytes."""

    timestamp_ms: int
    reason: CutReason
    jpeg: bytes


@dataclass(frozen=True, slots=True)
class VideoCut:
    """The cut: what the container said, the frames picked, and how many frames were decoded for it."""

    info: VideoInfo
    frames: list[CutFrame]
    decoded: int


def cut_keyframes(
    data: bytes,
    limits: VideoLimits,
    sampling: Sampling,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> VideoCut:
    """The frames of ``data`` to judge (see the module's docstring); the limits are checked first."""
    import av  # an extra: modgate[video]

    deadline = clock() + budget_s
    if len(data) > limits.max_bytes:
        from shaping.video.errors import VideoTooLarge

        raise VideoTooLarge(f"the video is {len(data):,} bytes, over the {limits.max_bytes:,}-byte limit")
    with open_container(data) as container:
        if is_still_image(container):
            raise UnsupportedVideoCodec(f"the file is a still image ({container.format.name}), not a video")
        stream = video_stream(container)
        codec = stream.codec_context
        info = VideoInfo(
            container=container.format.name, codec=codec.name, width=codec.width, height=codec.height,
            duration_ms=stream_duration_ms(container, stream), frames=stream.frames,
        )
        check_limits(info, limits)
        scenes = sampling.scene_threshold > 0
        if not scenes:
            codec.skip_frame = "NONKEY"
        codec.thread_type = "AUTO"
        min_gap_ms = 1000 / sampling.max_fps
        start = stream.start_time or 0
        time_base = Fraction(stream.time_base) if stream.time_base is not None else Fraction(1, 1000)
        kept: list[CutFrame] = []
        previous: np.ndarray | None = None
        decoded = 0
        try:
            for frame in container.decode(stream):
                decoded += 1
                if clock() > deadline:
                    raise VideoDecodeFailed(f"the video was not cut within {budget_s:g} s")
                reason: CutReason | None = "keyframe" if frame.key_frame else None
                if scenes:
                    thumbnail = frame.reformat(*THUMBNAIL, format="gray").to_ndarray().astype(np.int16)
                    if previous is not None and reason is None:
                        change = float(np.abs(thumbnail - previous).mean()) / 255
                        reason = "scene" if change >= sampling.scene_threshold else None
                    previous = thumbnail
                if reason is None or frame.pts is None:
                    continue
                timestamp_ms = max(0, int((frame.pts - start) * time_base * 1000))
                if kept and timestamp_ms - kept[-1].timestamp_ms < min_gap_ms:
                    continue
                buffer = io.BytesIO()
                frame.to_image().save(  # type: ignore[no-untyped-call]  # PyAV's stub leaves it untyped
                    buffer, "JPEG", quality=JPEG_QUALITY
                )
                kept.append(CutFrame(timestamp_ms, reason, buffer.getvalue()))
        except av.FFmpegError as exc:
            raise VideoDecodeFailed(
                f"the video is corrupt or truncated after {decoded} decoded frames ({exc})"[:300]
            ) from exc
    if not kept:
        raise VideoDecodeFailed("no frame of the video could be decoded")
    return VideoCut(info=info, frames=spread(kept, sampling.max_frames), decoded=decoded)


def spread(frames: list[CutFrame], count: int) -> list[CutFrame]:
    """At most ``count`` of ``frames``, evenly spread over them (the first and the last kept)."""
    if len(frames) <= count:
        return frames
    if count == 1:
        return frames[:1]
    return [frames[round(i * (len(frames) - 1) / (count - 1))] for i in range(count)]
