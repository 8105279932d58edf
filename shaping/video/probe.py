"""Open a container (its bytes, or a file the gateway spooled it to) and check it against the limits before
any frame is decoded."""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from shaping.video.errors import (
    InvalidVideoDataUrl,
    UnsupportedVideoCodec,
    VideoDecodeFailed,
    VideoTooLarge,
    VideoTooLong,
)

if TYPE_CHECKING:
    import av.container
    import av.video.stream


@dataclass(frozen=True, slots=True)
class VideoLimits:
    """What a video may be: bytes, seconds and pixels per frame (checked on every decoded frame), frames."""

    max_bytes: int
    max_duration_s: float
    max_pixels: int
    max_decoded_frames: int = 36_000  # 600 s at 60 fps


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """What the container says of its first video stream."""

    container: str
    codec: str
    width: int
    height: int
    duration_ms: int
    frames: int  # as the container counts them (0: it does not say)


VideoSource = bytes | Path
"""A video: its bytes, or the file holding them (read as it is demuxed, never whole into memory)."""


def source_size(source: VideoSource) -> int:
    """The video's size in bytes."""
    return len(source) if isinstance(source, bytes) else source.stat().st_size


@contextlib.contextmanager
def open_container(source: VideoSource) -> Iterator[av.container.InputContainer]:
    """The container in ``source``; :class:`VideoDecodeFailed` when FFmpeg finds no media in it.

    A file is handed to FFmpeg as an open Python file, as bytes are (a ``BytesIO``), never as a path: FFmpeg
    reads a path as a URL of its own protocols, and either way it reads only what the gateway gives it."""
    import av  # an extra: modgate[video]

    with contextlib.ExitStack() as stack:
        stream = io.BytesIO(source) if isinstance(source, bytes) else stack.enter_context(source.open("rb"))
        try:
            container = av.open(stream, mode="r", metadata_errors="ignore")
        except (av.FFmpegError, UnicodeDecodeError, ValueError) as exc:
            raise VideoDecodeFailed(
                f"the video could not be opened: not a media container, or corrupt ({exc})"[:300]
            ) from exc
        with container:
            yield container


def is_still_image(container: av.container.InputContainer) -> bool:
    """FFmpeg opens a JPEG or PNG as a one-frame "video" (its image demuxers): a still is not a video."""
    name = container.format.name
    return name.endswith("_pipe") or name.startswith("image2")


def video_stream(container: av.container.InputContainer) -> av.video.stream.VideoStream:
    """The first video stream with a decoder; :class:`UnsupportedVideoCodec` when there is none."""
    if not container.streams.video:
        raise UnsupportedVideoCodec(f"the {container.format.name} file has no video stream")
    stream = container.streams.video[0]
    codec = stream.codec_context
    if codec is None or not codec.name:
        raise UnsupportedVideoCodec("the video stream's codec is not one this gateway decodes")
    return stream


def stream_duration_ms(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> int:
    """The stream's duration from its own time base, else the container's (0 when neither says)."""
    if stream.duration is not None and stream.time_base is not None:
        return int(stream.duration * Fraction(stream.time_base) * 1000)
    if container.duration is not None:
        return int(container.duration / 1000)  # microseconds (AV_TIME_BASE)
    return 0


def check_limits(info: VideoInfo, limits: VideoLimits) -> None:
    """Refuse a video over the limits, saying which."""
    if info.width <= 0 or info.height <= 0:
        raise VideoDecodeFailed("the video stream declares no frame size")
    if info.width * info.height > limits.max_pixels:
        raise VideoTooLarge(
            f"the video's frames are {info.width}x{info.height}, over the {limits.max_pixels:,}-pixel limit"
        )
    if info.duration_ms > limits.max_duration_s * 1000:
        raise VideoTooLong(
            f"the video lasts {info.duration_ms / 1000:.1f} s, over the {limits.max_duration_s:g} s limit"
        )


def measured_duration_ms(
    container: av.container.InputContainer, stream: av.video.stream.VideoStream, limits: VideoLimits
) -> tuple[int, int]:
    """The end of the stream's last packet, read from the packets' timestamps (demuxed, not decoded), and
    how many packets it has: a container may state no duration (live Matroska or WebM, raw H.264) or a
    false one. Reading stops at the first packet past the duration limit (:class:`VideoTooLong`) or the
    frame cap."""
    start = stream.start_time or 0
    time_base = Fraction(stream.time_base) if stream.time_base is not None else Fraction(1, 1000)
    end_ms, packets = 0, 0
    for packet in container.demux(stream):
        if packet.pts is None:
            continue
        packets += 1
        if packets > limits.max_decoded_frames:
            raise VideoTooLarge(f"the video has more than {limits.max_decoded_frames:,} frames")
        end_ms = max(end_ms, int((packet.pts - start + (packet.duration or 0)) * time_base * 1000))
        if end_ms > limits.max_duration_s * 1000:
            raise VideoTooLong(f"the video runs past the {limits.max_duration_s:g} s limit")
    return end_ms, packets


def probe_video(source: VideoSource, limits: VideoLimits) -> VideoInfo:
    """The video's container, codec, size and duration (its packets' timestamps, when they say more than
    its header), checked against ``limits``; no frame is decoded."""
    import av  # an extra: modgate[video]

    size = source_size(source)
    if not size:
        raise VideoDecodeFailed("the video is empty")
    if size > limits.max_bytes:
        raise VideoTooLarge(f"the video is {size:,} bytes, over the {limits.max_bytes:,}-byte limit")
    with open_container(source) as container:
        if is_still_image(container):
            raise UnsupportedVideoCodec(
                f"the file is a still image ({container.format.name}), not a video: send stills as frames"
            )
        stream = video_stream(container)
        info = VideoInfo(
            container=container.format.name,
            codec=stream.codec_context.name,
            width=stream.codec_context.width,
            height=stream.codec_context.height,
            duration_ms=stream_duration_ms(container, stream),
            frames=stream.frames,
        )
        check_limits(info, limits)
        try:
            measured, packets = measured_duration_ms(container, stream, limits)
        except av.FFmpegError as exc:
            raise VideoDecodeFailed(f"the video's packets could not be read ({exc})"[:300]) from exc
    if info.frames and packets < info.frames and info.duration_ms - measured > 1000:
        raise VideoDecodeFailed(
            f"the video is truncated: its packets end at {measured / 1000:.1f} s of the "
            f"{info.duration_ms / 1000:.1f} s its header states"
        )
    if packets == 1:  # a one-picture GIF, or a video of one frame: a still, judged as a still is
        raise UnsupportedVideoCodec("the file holds one picture, a still image: send stills as frames")
    return replace(info, duration_ms=max(info.duration_ms, measured))


VIDEO_DATA_URL_PREFIX = re.compile(
    r"^data:video/[A-Za-z0-9.+-]{1,64}(?:;[^;,]{0,32}){0,4};base64,", re.IGNORECASE
)


def decode_video_data_url(url: str, max_bytes: int) -> bytes:
    """The bytes of a strict base64 ``data:video/…;base64,`` URL of at most ``max_bytes`` bytes."""
    header = VIDEO_DATA_URL_PREFIX.match(url)
    if header is None:
        raise InvalidVideoDataUrl("a video must be an https:// URL or a data:video/…;base64, URL")
    payload = url[header.end():]
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise VideoTooLarge(f"the video is over the {max_bytes:,}-byte limit")
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise InvalidVideoDataUrl("the video's data URL is not valid base64") from exc
    if len(data) > max_bytes:
        raise VideoTooLarge(f"the video is {len(data):,} bytes, over the {max_bytes:,}-byte limit")
    return data
