"""Videos made to slip harmful seconds past a keyframe sampler, each with its harmful seconds known.

Each is made of :func:`deploy.keyframes.render_keyframe` pictures (the simulator reads a label's marker
squares back from any cut frame), encoded with PyAV in the ways an uploader would choose to hide a scene:
a long GOP without scene-cut keyframes (x264's ``-g 120 -sc_threshold 0``), hard cuts, cross-fades, a
one-second flash, a variable frame rate, live Matroska (no duration in its header), a mid-stream size
change (MPEG-TS) and rotation metadata. ``harmful`` is the time ranges (ms) whose frames carry a block label;
fade frames between a harmful and a harmless picture count as neither.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from PIL import Image

from deploy.keyframes import render_keyframe

Picture = tuple[int, Image.Image]  # (pts in ms, picture)


@dataclass(frozen=True, slots=True)
class EvasiveVideo:
    """One video of the corpus: its bytes, what it is, and its harmful time ranges (ms)."""

    name: str
    data: bytes
    harmful: tuple[tuple[int, int], ...]
    duration_ms: int


def encode(
    pictures: Iterable[Picture],
    *,
    size: tuple[int, int],
    container: str = "mp4",
    gop: int = 120,
    options: dict[str, str] | None = None,
    container_options: dict[str, str] | None = None,
    rotation: int = 0,
) -> bytes:
    """H.264 (``libx264``, no scene-cut keyframes) of ``pictures`` at their own millisecond timestamps."""
    # A file, not memory: MP4's faststart rewrites the file in a second pass.
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "video"
        _write(path, pictures, size, container, gop, options or {}, container_options or {}, rotation)
        return path.read_bytes()


def _write(
    path: Path, pictures: Iterable[Picture], size: tuple[int, int], container: str, gop: int,
    options: dict[str, str], container_options: dict[str, str], rotation: int,
) -> None:
    import av

    with av.open(str(path), "w", format=container, options=container_options) as output:
        stream = output.add_stream("libx264", rate=25)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.gop_size = gop
        stream.options = {"crf": "12", "preset": "veryfast", "x264-params": "scenecut=0", **options}
        if rotation:
            stream.set_display_rotation(rotation)
        for pts, picture in pictures:
            frame = av.VideoFrame.from_image(picture)  # type: ignore[no-untyped-call]  # PyAV's stub leaves it untyped
            frame.pts, frame.time_base = pts, Fraction(1, 1000)
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))


def held(picture: Image.Image, start_ms: int, seconds: float, fps: float) -> list[Picture]:
    """``picture`` held ``seconds`` at ``fps`` from ``start_ms``."""
    step = 1000 / fps
    return [(round(start_ms + i * step), picture) for i in range(round(seconds * fps))]


def faded(one: Image.Image, other: Image.Image, start_ms: int, seconds: float, fps: float) -> list[Picture]:
    """A cross-fade from ``one`` to ``other``."""
    count = round(seconds * fps)
    return [(round(start_ms + i * 1000 / fps), Image.blend(one, other, (i + 1) / (count + 1)))
            for i in range(count)]


def corpus(size: tuple[int, int] = (320, 180), fps: float = 10) -> list[EvasiveVideo]:
    """The evasive corpus (about 12 s each at ``size`` and ``fps``)."""
    w, h = size

    def pic(label: str, seed: int, at: tuple[int, int] = size) -> Image.Image:
        return render_keyframe(label, at[0], at[1], seed)

    calm, calm2 = pic("allow", 1), pic("allow", 3)
    violent, hate = pic("block:violence", 2), pic("block:hate", 4)
    videos = []
    videos.append(EvasiveVideo("long GOP, no scene-cut keyframes", encode(
        held(calm, 0, 4, fps) + held(violent, 4000, 4, fps) + held(calm2, 8000, 4, fps), size=size,
        gop=round(12 * fps)), ((4000, 8000),), 12000))
    shots = [(calm, 0), (hate, 1), (calm2, 0), (violent, 1), (calm, 0), (hate, 1)]
    cut_pictures: list[Picture] = []
    harmful: list[tuple[int, int]] = []
    for number, (picture, bad) in enumerate(shots):
        cut_pictures += held(picture, number * 2000, 2, fps)
        if bad:
            harmful.append((number * 2000, number * 2000 + 2000))
    videos.append(EvasiveVideo("hard cuts every 2 s", encode(cut_pictures, size=size), tuple(harmful), 12000))
    videos.append(EvasiveVideo("cross-fades in and out", encode(
        held(calm, 0, 3, fps) + faded(calm, violent, 3000, 1, fps) + held(violent, 4000, 3, fps)
        + faded(violent, calm2, 7000, 1, fps) + held(calm2, 8000, 4, fps), size=size),
        ((4000, 7000),), 12000))
    videos.append(EvasiveVideo("1-second flash", encode(
        held(calm, 0, 5.5, fps) + held(violent, 5500, 1, fps) + held(calm2, 6500, 5.5, fps), size=size),
        ((5500, 6500),), 12000))
    # frames 2.9 s apart, then 30 fps for the harmful 2 s, then 3 s apart again
    vfr = [(0, calm), (2900, calm), (5800, calm), *held(violent, 6000, 2, 30), (8000, calm2), (11000, calm2)]
    videos.append(EvasiveVideo("variable frame rate", encode(vfr, size=size), ((6000, 8000),), 11040))
    videos.append(EvasiveVideo("live Matroska, no duration", encode(
        held(calm, 0, 4, fps) + held(violent, 4000, 4, fps) + held(calm2, 8000, 4, fps), size=size,
        container="matroska", container_options={"live": "1"}), ((4000, 8000),), 12000))
    big = (w * 2, h * 2)
    spliced = size_change(held(calm, 0, 4, fps), held(pic("block:violence", 2, big), 4000, 4, fps)
                          + held(pic("allow", 3, big), 8000, 4, fps), size, big)
    shift = resized_at_ms(spliced, big) - 4000  # the splice on the joined stream's own clock
    videos.append(EvasiveVideo("mid-stream size change (MPEG-TS)", spliced, ((4000 + shift, 8000 + shift),),
                               12000 + shift))
    # a phone's portrait video: stored on its side, shown upright by its display rotation (the label's
    # markers are at the top of the picture as shown, on its left edge as stored)
    upright = [render_keyframe(label, h, w, seed).rotate(-90, expand=True)
               for label, seed in (("allow", 1), ("block:violence", 2), ("allow", 3))]
    videos.append(EvasiveVideo("rotation metadata (portrait)", encode(
        held(upright[0], 0, 4, fps) + held(upright[1], 4000, 4, fps) + held(upright[2], 8000, 4, fps),
        size=size, rotation=90), ((4000, 8000),), 12000))
    return videos


def size_change(
    first: Sequence[Picture], second: Sequence[Picture], size: tuple[int, int], then: tuple[int, int]
) -> bytes:
    """One MPEG-TS stream whose frames are ``size`` and then ``then`` (two encodes, their timestamps
    continuous, the bytes joined as a broadcast splices them)."""
    return (encode(first, size=size, container="mpegts")
            + encode(second, size=then, container="mpegts"))


def resized_at_ms(data: bytes, size: tuple[int, int]) -> int:
    """Where on the stream's own clock (ms from its start) the first frame of ``size`` is."""
    import av

    with av.open(io.BytesIO(data), "r") as container:
        stream = container.streams.video[0]
        assert stream.time_base is not None
        for frame in container.decode(stream):
            if (frame.width, frame.height) == size and frame.pts is not None:
                return int((frame.pts - (stream.start_time or 0)) * stream.time_base * 1000)
    raise ValueError(f"no frame of {size}")
