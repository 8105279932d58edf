"""Why a video was refused: one tree, each class with a machine code and an HTTP status (as shaping.errors).

VideoRejected                      the client sent a video the gateway will not cut
├── VideoTooLarge                  413 video_too_large: more bytes or more pixels per frame than the limits
├── VideoTooLong                   413 video_too_long: longer than the duration limit
├── UnsupportedVideoCodec          415 unsupported_video_codec: no video stream, or none FFmpeg decodes
├── InvalidVideoDataUrl            400 invalid_data_url: not a strict base64 ``data:video/…`` URL
├── VideoDecodeFailed              422 video_decode_failed: not a container, truncated or corrupt
├── VideoTooManyFrames             422 video_too_many_frames: more distinct frames than max_frames to cover it
└── VideoCutTimeout                422 video_cut_timeout: not cut within the time budget
"""

from __future__ import annotations

from typing import ClassVar


class VideoRejected(Exception):
    """The client sent a video the gateway will not cut; ``code`` and ``status`` say how to answer."""

    code: ClassVar[str] = "invalid_video"
    status: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class VideoTooLarge(VideoRejected):
    """More bytes, more pixels in any decoded frame, or more decoded frames than the limits."""

    code = "video_too_large"
    status = 413


class VideoTooLong(VideoRejected):
    """Longer than the duration limit."""

    code = "video_too_long"
    status = 413


class UnsupportedVideoCodec(VideoRejected):
    """No video stream, or a codec this build of FFmpeg does not decode."""

    code = "unsupported_video_codec"
    status = 415


class VideoDecodeFailed(VideoRejected):
    """Not a media container at all, truncated or corrupt."""

    code = "video_decode_failed"
    status = 422


class InvalidVideoDataUrl(VideoRejected):
    """Not a strict base64 ``data:video/…`` URL."""

    code = "invalid_data_url"
    status = 400


class VideoTooManyFrames(VideoRejected):
    """Covering every ``max_gap_s`` of the video needs more distinct frames than ``max_frames``."""

    code = "video_too_many_frames"
    status = 422


class VideoCutTimeout(VideoRejected):
    """The video was not cut within its time budget."""

    code = "video_cut_timeout"
    status = 422
