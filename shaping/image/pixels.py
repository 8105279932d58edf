"""Decoded pixels to the token grid's size in RGB, and the fixed-settings JPEG the engine receives."""

from __future__ import annotations

import io
from typing import Final

import numpy as np
from PIL import Image

# RGB and grey frames: Pillow's bilinear after a box reduce by the integer part of the downscale (its own
# reducer, as thumbnail() does), 48 dB from the reference bicubic, well inside what the q90 re-encoding
# changes anyway, at two thirds of the bicubic's CPU (bench/shaping_cost.py, docs/performance.md). A SIMD
# resizer was faster still, but none with a Linux arm64 wheel (the Spark's) fits the runtime's size.
_RESAMPLE: Final = Image.Resampling.BILINEAR
_RESAMPLE_ALPHA: Final = Image.Resampling.BICUBIC  # frames with alpha keep Pillow's bicubic
_REDUCING_GAP: Final = 2.0
_SUBSAMPLING: Final = "4:2:0"
_WHITE: Final = (255, 255, 255, 255)


def resizable(image: Image.Image) -> Image.Image:
    """The pixels in a mode Pillow resizes faithfully: RGB, L, or RGBA/LA (alpha kept for compositing)."""
    mode = image.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        return _sixteen_bit_to_grey(image)
    if "transparency" in image.info and mode in ("P", "L", "RGB"):
        return image.convert("RGBA")  # palette alpha or a tRNS colour key becomes a real alpha channel
    if mode in ("RGB", "RGBA", "L", "LA"):
        return image
    if mode in ("PA", "RGBa"):
        return image.convert("RGBA")
    if mode in ("1", "La"):
        return image.convert("LA" if mode == "La" else "L")
    return image.convert("RGB")  # P without transparency, CMYK, YCbCr, ...


def _sixteen_bit_to_grey(image: Image.Image) -> Image.Image:
    """16-bit grey kept in tone: Pillow's own conversion clips everything above 255 to white."""
    wide = np.asarray(image)
    if wide.dtype.kind == "i":  # mode "I": 32-bit signed, holding a 16-bit PNG's 0..65535
        wide = np.clip(wide, 0, 65535)
    return Image.fromarray((wide >> 8).astype(np.uint8))


def resize(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """To ``size``: RGB and grey by Pillow's reducer and bilinear, frames with alpha by its bicubic."""
    if image.size == size:
        return image
    resample = _RESAMPLE if image.mode in ("RGB", "L") else _RESAMPLE_ALPHA
    return image.resize(size, resample, reducing_gap=_REDUCING_GAP)


def flatten_to_rgb(image: Image.Image) -> Image.Image:
    """RGB pixels; transparency composited on white, as a viewer would show it."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA"):
        rgba = image.convert("RGBA") if image.mode == "LA" else image
        return Image.alpha_composite(Image.new("RGBA", image.size, _WHITE), rgba).convert("RGB")
    return image.convert("RGB")


def encode_jpeg(image: Image.Image, quality: int) -> bytes:
    """Baseline JPEG, fixed settings, no metadata: same pixels and settings, same bytes."""
    buffer = io.BytesIO()
    image.save(
        buffer,
        "JPEG",
        quality=quality,
        subsampling=_SUBSAMPLING,
        optimize=False,  # optimised Huffman tables save ~7 % of the bytes for ~1.5 ms a frame: not worth it
        progressive=False,
        exif=b"",
        icc_profile=None,
        comment=b"",  # Pillow would otherwise copy the source's COM segment
    )
    return buffer.getvalue()
