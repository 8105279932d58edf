"""Pillow's decode, held to what the header promised: lazy open, load, frame count, EXIF orientation."""

from __future__ import annotations

import io
import re
import struct
from typing import Final

from PIL import Image, ImageFile

from shaping.errors import AnimatedImage, ImageDecodeFailed, ImageDimensionsTooLarge, short_reason
from shaping.image.limits import FORMAT_LABELS, ImageFormat, ImageLimits

# As ImageOps.exif_transpose maps them.
TRANSPOSE_FOR_ORIENTATION: Final[dict[int, Image.Transpose]] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_EXIF_ORIENTATION_TAG: Final = 0x0112
_XMP_ORIENTATION: Final = re.compile(rb'tiff:Orientation(?:="|>)([0-9])')

# Pillow errors that mean "these bytes are not a valid image" (UnidentifiedImageError is an OSError).
_PILLOW_DATA_ERRORS: Final = (OSError, SyntaxError, ValueError, EOFError, struct.error)


def open_image(data: bytes, image_format: ImageFormat) -> ImageFile.ImageFile:
    """Pillow's lazy open with only the sniffed format's plugin: headers parsed, no pixel decoded."""
    try:
        return Image.open(io.BytesIO(data), formats=[image_format])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Only reachable if Pillow reads a larger size than the header check did.
        raise ImageDimensionsTooLarge(
            f"the {FORMAT_LABELS[image_format]} is too large to decode ({short_reason(exc)})"
        ) from exc
    except _PILLOW_DATA_ERRORS as exc:
        raise ImageDecodeFailed(
            f"the {FORMAT_LABELS[image_format]} header could not be read ({short_reason(exc)})"
        ) from exc


def load_pixels(image: ImageFile.ImageFile, label: str) -> None:
    try:
        image.load()
    except _PILLOW_DATA_ERRORS as exc:
        raise ImageDecodeFailed(f"the {label} is corrupt or truncated ({short_reason(exc)})") from exc


def check_decoded_size(image: Image.Image, stored_size: tuple[int, int], label: str) -> None:
    """The pixels decoded are the size the header promised, at the DCT scale asked for (1, 1/2, 1/4, 1/8)."""
    width, height = stored_size
    promised = {(-(-width // scale), -(-height // scale)) for scale in (1, 2, 4, 8)}
    if image.size not in promised or image.im.size != image.size:
        raise ImageDecodeFailed(
            f"the {label} decoded to {image.im.size[0]}×{image.im.size[1]} pixels, not the "
            f"{width}×{height} its header states"
        )


def check_frames(
    image: ImageFile.ImageFile, image_format: ImageFormat, label: str, limits: ImageLimits
) -> None:
    """Refuse animation unless the first frame is wanted (Pillow has already opened at frame 0)."""
    if image_format == "JPEG":
        return  # an MPO's further pictures are stereo views or previews, not animation: use the first
    frames = getattr(image, "n_frames", 1)
    if isinstance(frames, int) and frames > 1 and limits.animated == "refuse":
        raise AnimatedImage(f"the {label} is animated ({frames} frames); send one still keyframe")


def orientation_of(image: Image.Image) -> int:
    """The EXIF orientation (1 to 8, 1 if absent), read as Pillow's getexif() reads it, XMP as fallback.

    Parsed here rather than with getexif(), which warns about, or raises on, malformed EXIF.
    """
    exif = image.info.get("exif")
    if exif is None and isinstance(raw_profile := image.info.get("Raw profile type exif"), str):
        try:  # ImageMagick's PNG text chunk: "\nexif\n<length>\n<hex>"
            exif = bytes.fromhex("".join(raw_profile.split("\n")[3:]))
        except ValueError:
            exif = None
    if isinstance(exif, bytes) and (value := _exif_orientation(exif)) is not None:
        return value
    for key in ("xmp", "XML:com.adobe.xmp"):
        xmp = image.info.get(key)
        if isinstance(xmp, str):
            xmp = xmp.encode("utf-8", "replace")
        if isinstance(xmp, bytes) and (match := _XMP_ORIENTATION.search(xmp)):
            return int(match[1])
    return 1


def _exif_orientation(exif: bytes) -> int | None:
    """The Orientation tag of IFD0 in a TIFF-structured EXIF block, or None if absent or unreadable."""
    tiff = exif[6:] if exif.startswith(b"Exif\x00\x00") else exif
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return None
    order = "<" if tiff[:2] == b"II" else ">"
    magic, first_ifd = struct.unpack(order + "HI", tiff[2:8])
    if magic != 42 or first_ifd + 2 > len(tiff):
        return None
    (entries,) = struct.unpack(order + "H", tiff[first_ifd : first_ifd + 2])
    for index in range(entries):
        entry = first_ifd + 2 + 12 * index
        if entry + 12 > len(tiff):
            return None
        tag, kind, count = struct.unpack(order + "HHI", tiff[entry : entry + 8])
        if tag == _EXIF_ORIENTATION_TAG:
            if kind != 3 or count < 1:  # SHORT
                return None
            (value,) = struct.unpack(order + "H", tiff[entry + 8 : entry + 10])
            return int(value)
    return None


def as_displayed(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    return (size[1], size[0]) if orientation in (5, 6, 7, 8) else size
