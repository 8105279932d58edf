"""Video in, keyframes out: pure steps, as ``shaping/image`` is for stills (no web framework, no Redis).

``probe`` opens a container and checks it against the limits (a video stream, a decodable codec, the
duration and the pixels); ``cut`` picks the frames to judge (the stream's own keyframes plus shot changes,
capped by a rate and a count) and answers each as JPEG bytes with its ``timestamp_ms``; ``segments`` merges
judged frames into time ranges of one verdict. PyAV is an extra (``modgate[video]``): imported lazily.
"""

from shaping.video.cut import CutFrame, Sampling, VideoCut, cut_keyframes
from shaping.video.errors import (
    InvalidVideoDataUrl,
    UnsupportedVideoCodec,
    VideoDecodeFailed,
    VideoRejected,
    VideoTooLarge,
    VideoTooLong,
)
from shaping.video.probe import VideoInfo, VideoLimits, decode_video_data_url, probe_video
from shaping.video.segments import FrameVerdict, Segment, merge_segments

__all__ = [
    "CutFrame",
    "FrameVerdict",
    "InvalidVideoDataUrl",
    "Sampling",
    "Segment",
    "UnsupportedVideoCodec",
    "VideoCut",
    "VideoDecodeFailed",
    "VideoInfo",
    "VideoLimits",
    "VideoRejected",
    "VideoTooLarge",
    "VideoTooLong",
    "cut_keyframes",
    "decode_video_data_url",
    "merge_segments",
    "probe_video",
]
