"""Synthetic videos made of synthetic keyframes: scenes of one label each, encoded with PyAV.

Each scene is one :func:`deploy.keyframes.render_keyframe` picture held for its length, so the simulator
reads the scene's label back from any frame cut out of it. H.264 (``libx264``, at a low ``crf`` so the
label's marker squares stay flat) where PyAV's FFmpeg has it, else MPEG-4 Part 2.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from deploy.keyframes import render_keyframe


@dataclass(frozen=True, slots=True)
class Scene:
    """``seconds`` of one labelled picture."""

    label: str
    seconds: float
    seed: int = 0


def video_codec() -> str:
    """``libx264`` where PyAV's FFmpeg has the encoder, else ``mpeg4``."""
    import av  # an extra: modgate[video]

    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def make_video(
    scenes: Sequence[Scene],
    *,
    width: int = 320,
    height: int = 180,
    fps: int = 4,
    keyframe_every_s: float = 1.0,
    codec: str | None = None,
    keyframes_at_cuts: bool = True,
) -> bytes:
    """MP4 bytes of ``scenes`` one after another, a keyframe every ``keyframe_every_s`` seconds (and, unless
    ``keyframes_at_cuts`` is False, where the encoder sees a scene change)."""
    import av

    codec = codec or video_codec()
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream(codec, rate=fps)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.gop_size = max(1, round(fps * keyframe_every_s))
        # High quality: lossy coding must not blur the marker squares the simulator reads.
        options: dict[str, object] = {"crf": "12", "preset": "veryfast"} if codec == "libx264" else {}
        if not keyframes_at_cuts:  # x264 reads its own scenecut; other encoders FFmpeg's sc_threshold
            options["x264-params" if codec == "libx264" else "sc_threshold"] = (
                "scenecut=0" if codec == "libx264" else "0"
            )
        stream.options = options
        for scene in scenes:
            still = render_keyframe(scene.label, width, height, scene.seed)
            picture = av.VideoFrame.from_image(still)  # type: ignore[no-untyped-call]  # PyAV's stub leaves it untyped
            for _ in range(round(scene.seconds * fps)):
                output.mux(stream.encode(picture))
        output.mux(stream.encode(None))
    return buffer.getvalue()
