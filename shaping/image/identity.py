"""A frame's identity for the verdict cache: its pHash and 16×9 colour thumbnail, from 8×-reduced pixels."""

from __future__ import annotations

from typing import Final

import numpy as np
from PIL import Image

# The identity is computed at 1/8 scale when the short side stays at least 32 pixels (pHash works at 32×32).
IDENTITY_SCALE: Final = 8
_IDENTITY_MIN_SIDE: Final = 32
THUMBNAIL_SIZE: Final = (16, 9)  # a 16:9 frame's cells stay square; other shapes are squeezed alike
# The 8 lowest rows of the unnormalised 32-point DCT-II (scipy.fftpack.dct's default, which imagehash calls):
# y[k] = 2 Σ x[n] cos(π k (2n + 1) / 64). A matrix product here, so the runtime needs no scipy.
_DCT_LOW: Final = 2 * np.cos(np.pi * np.arange(8)[:, None] * (2 * np.arange(32)[None, :] + 1) / 64)


def identity_scale(size: tuple[int, int]) -> int:
    """1/8 when the frame's short side stays at least 32 pixels at that scale, else full size."""
    return IDENTITY_SCALE if min(size) >= IDENTITY_SCALE * _IDENTITY_MIN_SIDE else 1


def frame_identity(reduced: Image.Image) -> tuple[str, bytes]:
    """(pHash as 16 hex digits, 16×9 RGB thumbnail) of a frame's pixels reduced by ``identity_scale``.

    The pHash is imagehash's ``phash`` (grey, Lanczos to 32×32, 2-D DCT-II, the 8×8 lowest frequencies
    against their median), its bits packed here rather than through its string building.
    """
    rgb = reduced if reduced.mode == "RGB" else reduced.convert("RGB")
    thumbnail = rgb.resize(THUMBNAIL_SIZE, Image.Resampling.BOX).tobytes()
    grey = np.asarray(rgb.convert("L").resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64)
    low = _DCT_LOW @ grey @ _DCT_LOW.T
    bits = np.packbits(low > np.median(low)).tobytes()
    return bits.hex(), thumbnail
