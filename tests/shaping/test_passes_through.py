"""``passes_through``: what a JPEG's first bytes say about where its shaping runs (a guess, never a check).

A wrong "yes" would hold the event loop for a full decode and encode, a wrong "no" only costs a thread's
hand-off; either way ``shape_image`` decides what it does with the whole file, so the property that matters
is: every "yes" is a frame ``shape_image`` passes through.
"""

from __future__ import annotations

import io

import pytest
from PIL import Image

from deploy.keyframes import make_keyframe
from shaping.image import ImageLimits, passes_through, shape_image
from shaping.image.jpeg import baseline_jpeg_stream
from shaping.tokens import TokenGrid

GRID = TokenGrid()
ON_GRID = make_keyframe("allow", 1088, 608, seed=1)


def reencoded(data: bytes, **save: object) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        pixels = image.convert(str(save.pop("mode", "RGB")))
    out = io.BytesIO()
    pixels.save(out, "JPEG", quality=90, **save)
    return out.getvalue()


def rotated_exif() -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to display
    return exif


def test_an_on_grid_baseline_jpeg_passes_through_and_shaping_agrees() -> None:
    assert passes_through(ON_GRID, GRID)
    assert shape_image(ON_GRID, ImageLimits(), GRID).passthrough


def test_its_first_kilobytes_are_enough_to_say_so() -> None:
    assert passes_through(ON_GRID[:6 * 1024], GRID)
    assert not passes_through(ON_GRID[:100], GRID)  # no frame header within: no


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(make_keyframe("allow", 1280, 720, seed=1), id="off-grid"),
        pytest.param(reencoded(ON_GRID, progressive=True), id="progressive"),
        pytest.param(reencoded(ON_GRID, mode="L"), id="greyscale"),
        pytest.param(reencoded(ON_GRID, mode="CMYK"), id="cmyk-adobe"),
        pytest.param(reencoded(ON_GRID, exif=rotated_exif()), id="exif-rotated"),
        pytest.param(b"\x89PNG\r\n\x1a\n" + ON_GRID, id="png-magic"),
        pytest.param(b"", id="empty"),
        pytest.param(ON_GRID[:2] + b"\xff\xda\x00\x02" + ON_GRID[2:], id="scan-before-frame-header"),
    ],
)
def test_anything_else_goes_to_the_threads(frame: bytes) -> None:
    assert not passes_through(frame, GRID)


@pytest.mark.parametrize("size", [(1088, 608), (1056, 640), (608, 1088), (1280, 720), (640, 360), (896, 896)])
def test_the_guess_is_what_shaping_does(size: tuple[int, int]) -> None:
    frame = make_keyframe("allow", *size, seed=3)
    assert passes_through(frame, GRID) == shape_image(frame, ImageLimits(), GRID).passthrough


def test_a_frame_with_nothing_to_drop_goes_on_as_the_callers_own_bytes() -> None:
    assert baseline_jpeg_stream(ON_GRID) is ON_GRID  # not a copy of an image-sized scan
    with_comment = ON_GRID[:2] + b"\xff\xfe\x00\x07hello" + ON_GRID[2:]
    assert baseline_jpeg_stream(with_comment) == ON_GRID
    assert baseline_jpeg_stream(ON_GRID + b"trailing") == ON_GRID
