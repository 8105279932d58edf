"""Decoded pixels to the token grid's size in RGB, and the fixed-settings JPEG the engine receives."""

from __future__ import annotations

import io
import threading
from typing import Final

import numpy as np
from cykooz_resizer import FilterType, ResizeAlg, ResizeOptions, Resizer
from PIL import Image

_RESAMPLE: Final = Image.Resampling.BICUBIC
# For frames with alpha (Pillow's bicubic): box-reduce by an integer factor first when the downscale is at
# least twice that factor, as Pillow's own thumbnail() does.
_REDUCING_GAP: Final = 2.0
_SUBSAMPLING: Final = "4:2:0"
_WHITE: Final = (255, 255, 255, 255)
# Pillow's own bicubic (Catmull-Rom, antialiased over every source pixel, what Qwen's processor uses), in
# fast_image_resize's SIMD: as fast as OpenCV's linear pass for a 9 MB wheel instead of OpenCV's 153 MB
# (bench/shaping_cost.py; docs/performance.md). Single-threaded: shaping already runs a frame per worker.
_BICUBIC: Final = ResizeOptions(resize_alg=ResizeAlg.convolution(FilterType.catmull_rom))
_resizers = threading.local()  # a Resizer keeps scratch buffers between calls: one per thread


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
    """To ``size``: RGB and grey by a SIMD bicubic (Pillow's own filter), frames with alpha by Pillow's."""
    if image.size == size:
        return image
    if image.mode not in ("RGB", "L"):
        return image.resize(size, _RESAMPLE, reducing_gap=_REDUCING_GAP)
    resizer = getattr(_resizers, "resizer", None)
    if resizer is None:
        resizer = _resizers.resizer = Resizer()
    resized = Image.new(image.mode, size)
    resizer.resize_pil(image, resized, _BICUBIC)
    return resized


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
