"""Video in, keyframes out: pure steps, as ``shaping/image`` is for stills (no web framework, no Redis).

``probe`` opens a container (its bytes, or the file they were spooled to) and checks it against the limits
(a video stream, a decodable codec, the duration, measured from its packets, and the pixels); ``cut``
decodes every frame and covers the video on the clock and at shot changes (``scenes``: FFmpeg's scdet),
reusing a look-alike's verdict where nothing changed (``coverage``), and answers each frame to judge as JPEG
bytes with its ``timestamp_ms``; ``segments`` merges covered frames into time ranges of one verdict. PyAV
is an extra (``modgate[video]``): imported lazily.
"""

from shaping.video.coverage import Coverage, Covered, Identity, Likeness
from shaping.video.cut import SCENE_THRESHOLD, CutFrame, Encode, Sampling, VideoCut, cut_video
from shaping.video.errors import (
    InvalidVideoDataUrl,
    UnsupportedVideoCodec,
    VideoCutTimeout,
    VideoDecodeFailed,
    VideoRejected,
    VideoTooLarge,
    VideoTooLong,
    VideoTooManyFrames,
)
from shaping.video.probe import VideoInfo, VideoLimits, VideoSource, decode_video_data_url, probe_video
from shaping.video.segments import FrameVerdict, Segment, merge_segments

__all__ = [
    "SCENE_THRESHOLD",
    "Coverage",
    "Covered",
    "CutFrame",
    "Encode",
    "FrameVerdict",
    "Identity",
    "InvalidVideoDataUrl",
    "Likeness",
    "Sampling",
    "Segment",
    "UnsupportedVideoCodec",
    "VideoCut",
    "VideoCutTimeout",
    "VideoDecodeFailed",
    "VideoInfo",
    "VideoLimits",
    "VideoRejected",
    "VideoSource",
    "VideoTooLarge",
    "VideoTooLong",
    "VideoTooManyFrames",
    "cut_video",
    "decode_video_data_url",
    "merge_segments",
    "probe_video",
]
