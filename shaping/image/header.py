"""The format from the magic bytes and the size from the header, read by hand before Pillow sees the data.

Pillow's WebP decoder allocates its canvas when the file is opened, so the size is checked against the
limits from the bytes alone first.
"""

from __future__ import annotations

import struct
from typing import Final

from shaping.errors import EmptyImage, ImageDecodeFailed, ImageDimensionsTooLarge, UnsupportedImageFormat
from shaping.image.jpeg import JPEG_FRAME_MARKERS, MalformedJpeg, jpeg_segments
from shaping.image.limits import FORMAT_LABELS, ImageFormat, ImageLimits

_OTHER_SIGNATURES: Final[tuple[tuple[bytes, str], ...]] = (
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"BM", "a BMP image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x00\x00\x01\x00", "an ICO image"),
    (b"8BPS", "a Photoshop document"),
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"\xff\x0a", "a JPEG XL image"),
    (b"\x00\x00\x00\x0cJXL ", "a JPEG XL image"),
    (b"\x00\x00\x00\x0cjP  ", "a JPEG 2000 image"),
    (b"\xff\x4f\xff\x51", "a JPEG 2000 codestream"),
)


def sniff_format(data: bytes, limits: ImageLimits) -> ImageFormat:
    """The format the magic bytes say, if the gateway accepts it."""
    found: ImageFormat
    if data.startswith(b"\xff\xd8\xff"):
        found = "JPEG"
    elif data.startswith(b"\x89PNG\r\n\x1a\n"):
        found = "PNG"
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        found = "WEBP"
    else:
        raise UnsupportedImageFormat(f"{_describe(data)} is not an accepted image; send {_accepted(limits)}")
    if found not in limits.allowed_formats:
        raise UnsupportedImageFormat(
            f"{FORMAT_LABELS[found]} images are not accepted here; send {_accepted(limits)}"
        )
    return found


def _describe(data: bytes) -> str:
    """What unsupported data looks like, in words, without echoing it."""
    for signature, name in _OTHER_SIGNATURES:
        if data.startswith(signature):
            return name
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        if brand in (b"avif", b"avis"):
            return "an AVIF image"
        if brand in (b"heic", b"heix", b"hevc", b"mif1", b"msf1"):
            return "a HEIF image"
        return "an ISO media file (MP4, MOV, ...)"
    if data.startswith(b"RIFF"):
        return "a RIFF file that is not WebP"
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith(b"<"):
        if b"<svg" in head:
            return "SVG text"
        if b"<html" in head or b"<!doctype html" in head:
            return "HTML text"
        return "XML text"
    return f"data starting with bytes {data[:8].hex(' ')}"


def _accepted(limits: ImageLimits) -> str:
    names = [FORMAT_LABELS[name] for name in ("JPEG", "PNG", "WEBP") if name in limits.allowed_formats]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def size_from_header(data: bytes, image_format: ImageFormat) -> tuple[int, int]:
    """(width, height) as the header states it, read without Pillow."""
    if image_format == "PNG":
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ImageDecodeFailed("the PNG has no IHDR header where the format requires one")
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if image_format == "WEBP":
        return _webp_size(data)
    try:
        for segment in jpeg_segments(data):
            if segment.marker in JPEG_FRAME_MARKERS:
                header = data[segment.start : segment.end].lstrip(b"\xff")  # marker, length, precision, size
                if len(header) < 8:
                    raise MalformedJpeg("its frame header is too short")
                height, width = struct.unpack(">HH", header[4:8])
                return width, height
            if segment.marker in (0xDA, 0xD9):
                raise MalformedJpeg("it has no frame header before its image data")
    except MalformedJpeg as exc:
        raise ImageDecodeFailed(f"the JPEG is malformed: {exc}") from exc
    raise AssertionError("unreachable: jpeg_segments ends with EOI or raises")  # pragma: no cover


def _webp_size(data: bytes) -> tuple[int, int]:
    """The canvas size from a WebP's first chunk: lossy VP8, lossless VP8L or extended VP8X."""
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise ImageDecodeFailed("the WebP has no readable VP8, VP8L or VP8X header")


def check_dimensions(label: str, width: int, height: int, limits: ImageLimits) -> None:
    if width == 0 or height == 0:
        raise EmptyImage(f"the {label} header says {width}×{height} pixels: there is no picture")
    if width * height > limits.max_pixels_decoded:
        raise ImageDimensionsTooLarge(
            f"{label} header says {width}×{height} pixels, over the {limits.max_pixels_decoded:,} limit"
        )
    if max(width, height) > limits.max_side:
        raise ImageDimensionsTooLarge(
            f"{label} header says {width}×{height} pixels; no side may be over {limits.max_side:,} pixels"
        )
