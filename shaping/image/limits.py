"""The formats a keyframe may come in and the limits it must meet before any pixel is decoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from PIL import Image

ImageFormat = Literal["JPEG", "PNG", "WEBP"]
"""Formats the gateway accepts, named as Pillow names them."""

SUPPORTED_FORMATS: Final[frozenset[ImageFormat]] = frozenset({"JPEG", "PNG", "WEBP"})

FORMAT_LABELS: Final[dict[ImageFormat, str]] = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageLimits:
    """What a keyframe may be before any pixel is decoded.

    ``max_pixels_decoded`` must stay within Pillow's own decompression-bomb threshold
    (``PIL.Image.MAX_IMAGE_PIXELS``, about 89 million), or Pillow would warn or refuse before these limits
    get their say. ``animated="first_frame"`` shapes the first frame of an animated PNG or WebP instead of
    refusing it.
    """

    max_bytes: int = 10 * 1024 * 1024
    max_pixels_decoded: int = 40_000_000
    max_side: int = 16384
    allowed_formats: frozenset[ImageFormat] = SUPPORTED_FORMATS
    animated: Literal["refuse", "first_frame"] = "refuse"

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels_decoded", "max_side"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        formats = frozenset(self.allowed_formats)
        if not formats or not formats <= SUPPORTED_FORMATS:
            raise ValueError(
                f"allowed_formats must be a non-empty subset of JPEG, PNG, WEBP, got {sorted(formats)}"
            )
        object.__setattr__(self, "allowed_formats", formats)  # a set passed in becomes immutable
        if self.animated not in ("refuse", "first_frame"):
            raise ValueError(f"animated must be 'refuse' or 'first_frame', got {self.animated!r}")
        bomb_threshold = Image.MAX_IMAGE_PIXELS
        if bomb_threshold is not None and self.max_pixels_decoded > bomb_threshold:
            raise ValueError(
                f"max_pixels_decoded {self.max_pixels_decoded:,} is above Pillow's decompression-bomb "
                f"threshold {bomb_threshold:,}: Pillow would warn or refuse before this limit applies"
            )
