"""Untrusted keyframe bytes in; a shaped JPEG out, whose engine token count is known before it leaves.

The cheapest refusal comes first, and nothing is decoded before its size is known:

1. bytes: not empty, at most ``max_bytes``;
2. format, from the magic bytes: JPEG, PNG or WebP, and in the allowlist (anything else is 415);
3. size, read from the header by hand before Pillow sees the data (Pillow's WebP decoder allocates its
   canvas when the file is opened): no empty image, at most ``max_pixels_decoded`` pixels and ``max_side``;
4. Pillow opens the data lazily with only the sniffed format's plugin; its size is checked again, the
   aspect ratio too (at most 200:1, as the model), and animation is refused or its first frame taken;
5. decoding: a JPEG is decoded with DCT-domain scaling (``draft``) when a 1/2, 1/4 or 1/8 scale still
   covers the target size, which is far cheaper than decoding everything and resizing; the decoded size
   must be the one the header promised at that scale;
6. pixels: palette, 16-bit, CMYK and greyscale to RGB (alpha composited on white), a box ``reduce`` by
   the integer part of the downscale, then one bilinear pass (OpenCV) to the ``smart_resize`` target, EXIF
   orientation applied last, on the small image, as ``ImageOps.exif_transpose`` would. The bilinear pass
   after the box reduce differs from Pillow's antialiased bicubic (what Qwen's processor uses) by less
   than the JPEG q90 encoding that follows does (PSNR 45-51 dB against 36-41 dB, docs/performance.md),
   at a sixth to a tenth of its cost; RGBA and LA frames keep Pillow's bicubic, which handles their alpha;
7. a baseline JPEG at a fixed quality with 4:2:0 chroma, no Huffman optimisation and no metadata at all
   (EXIF, ICC, XMP, comments): the same input gives the same bytes.

Identity: the pHash and the 16×9 colour thumbnail the verdict cache matches frames by are computed from
the shaped pixels box-reduced 8× (136×76 for a 1088×608 frame), not from the full frame: the same hash
within a few bits (tests/shaping/test_frame_identity.py measures how far) for a fortieth of the work.

Passthrough: a baseline JPEG already exactly on the grid and not rotated is sent as its own bitstream. Its
metadata segments and any bytes after its end-of-image marker are dropped, and it is decoded once at 1/8
scale: every entropy-coded bit is still read (a truncated or corrupt stream still fails), only the inverse
DCT is cut to the DC term, which is the 8×8 block mean the identity needs. Polyglots (a JPEG with a ZIP or
HTML appended, a PNG with trailing data) are otherwise shaped from decoded pixels only, so no byte the
client sent reaches the engine unread.

Colour profiles are not applied, on purpose: the engine's own loader ignores them too.

Everything here is synchronous and keeps no state between calls: the gateway runs it in a thread pool
(Pillow releases the GIL while it decodes, resizes and encodes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

import cv2
import numpy as np
import scipy.fftpack
from PIL import Image, ImageFile

from shaping.errors import (
    AnimatedImage,
    EmptyImage,
    ImageDecodeFailed,
    ImageDimensionsTooLarge,
    ImageTooLarge,
    InvalidDataUrl,
    UnsupportedImageFormat,
)
from shaping.tokens import TokenGrid, smart_resize

ImageFormat = Literal["JPEG", "PNG", "WEBP"]
"""Formats the gateway accepts, named as Pillow names them."""

SUPPORTED_FORMATS: Final[frozenset[ImageFormat]] = frozenset({"JPEG", "PNG", "WEBP"})
SHAPED_MIME: Final = "image/jpeg"

_LABELS: Final[dict[ImageFormat, str]] = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP"}
_RESAMPLE: Final = Image.Resampling.BICUBIC
# For frames with alpha (Pillow's bicubic): box-reduce by an integer factor first when the downscale is at
# least twice that factor, as Pillow's own thumbnail() does.
_REDUCING_GAP: Final = 2.0
# The identity is computed at 1/8 scale when the short side stays at least 32 pixels (pHash works at 32×32).
IDENTITY_SCALE: Final = 8
_IDENTITY_MIN_SIDE: Final = 32
THUMBNAIL_SIZE: Final = (16, 9)  # a 16:9 frame's cells stay square; other shapes are squeezed alike
_SUBSAMPLING: Final = "4:2:0"
_WHITE: Final = (255, 255, 255, 255)

# As ImageOps.exif_transpose maps them.
_TRANSPOSE_FOR_ORIENTATION: Final[dict[int, Image.Transpose]] = {
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapedImage:
    """A keyframe ready for the engine: JPEG bytes exactly on the token grid, with its identities.

    ``width``/``height`` and ``source_width``/``source_height`` are both as displayed (EXIF orientation
    applied). ``phash`` is imagehash's 64-bit perceptual hash and ``thumbnail`` the 16×9 RGB cell means
    (432 bytes) of the shaped pixels box-reduced 8× (the DCT's DC terms for a passthrough frame).
    ``passthrough`` is true when the source JPEG's own bitstream was reused (no decode-resize-encode);
    its metadata and trailing bytes are still dropped. ``decoded_size`` is the size the decoder produced,
    as stored (1/8 of a passthrough frame each way, the DCT-scaled size of a drafted JPEG).
    """

    data: bytes = field(repr=False)
    mime: str
    width: int
    height: int
    source_width: int
    source_height: int
    source_format: ImageFormat
    image_tokens: int
    sha256: str
    phash: str
    thumbnail: bytes = field(repr=False)
    passthrough: bool
    decoded_size: tuple[int, int]  # the pixels the decoder produced (DCT scaling makes them fewer)

    @property
    def data_url(self) -> str:
        """The shaped bytes as a base64 ``data:`` URL, as the engine's ``image_url`` takes them."""
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def shape_image(data: bytes, limits: ImageLimits, grid: TokenGrid, *, jpeg_quality: int = 90) -> ShapedImage:
    """Check, decode and shape one keyframe; raises :class:`~shaping.errors.ImageRejected` if refused."""
    if not 1 <= jpeg_quality <= 100:
        raise ValueError(f"jpeg_quality must be within 1..100, got {jpeg_quality}")
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # A process-wide Pillow switch: with it on, truncated frames would decode as grey and pass.
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on; image shaping refuses to run with it")
    if not data:
        raise EmptyImage("the image has no bytes")
    if len(data) > limits.max_bytes:
        raise ImageTooLarge(f"the image is {len(data):,} bytes, over the {limits.max_bytes:,}-byte limit")
    image_format = _sniff_format(data, limits)
    label = _LABELS[image_format]
    header_size = _header_size(data, image_format)
    _check_dimensions(label, *header_size, limits)

    with _open(data, image_format) as image:
        # Pillow's reading is the one decoding will follow: it must be ours (a second frame header, say,
        # would have Pillow decode a picture of another size than the one checked).
        stored_size = image.size
        if stored_size != header_size:
            raise ImageDecodeFailed(
                f"the {label} header states {header_size[0]}×{header_size[1]} pixels, but the image reads "
                f"as {stored_size[0]}×{stored_size[1]}"
            )
        # smart_resize is symmetric: the target in stored orientation, transposed with the pixels at the end.
        target = smart_resize(*stored_size, grid)
        _check_frames(image, image_format, label, limits)
        if image_format == "JPEG":
            if image.size == target and image.mode == "RGB" and _orientation(image) == 1:
                stream = _baseline_jpeg_stream(data)
                if stream is not None:
                    return _passthrough(stream, grid)
            # DCT-domain scaling: Pillow picks 1/2, 1/4 or 1/8 only where the result still covers the target.
            image.draft("RGB", target)
        _load(image, label)
        _check_decoded_size(image, stored_size, label)
        decoded_size = image.size
        orientation = _orientation(image)
        pixels = _resize(_resizable(image), target)
        pixels = _flatten_to_rgb(pixels)
        transpose = _TRANSPOSE_FOR_ORIENTATION.get(orientation)
        if transpose is not None:
            pixels = pixels.transpose(transpose)
        source_width, source_height = _as_displayed(stored_size, orientation)
        scale = _identity_scale(pixels.size)
        return _shaped(
            _encode_jpeg(pixels, jpeg_quality),
            pixels.size,
            pixels.reduce(scale) if scale > 1 else pixels,
            grid,
            source=(source_width, source_height, image_format),
            decoded_size=decoded_size,
        )


def decode_data_url(url: str, max_bytes: int) -> tuple[str, bytes]:
    """The ``(mime, payload)`` of a strict base64 ``data:image/...`` URL of at most ``max_bytes`` bytes.

    The declared type is only checked to be an image type: the format is judged later from the bytes.
    """
    if url[:5].lower() != "data:":
        scheme, colon, _ = url[:32].partition(":")
        shown = (
            f"an {scheme.lower()!r} URL"
            if colon and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme)
            else "not a URL"
        )
        raise InvalidDataUrl(f"only data: URLs are accepted (the gateway never fetches images); got {shown}")
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise InvalidDataUrl("the data URL has no comma between its header and its data")
    if len(header) > 256:
        raise InvalidDataUrl("the data URL header is longer than 256 characters")
    mime, *parameters = (part.strip().lower() for part in header.split(";"))
    if not parameters or parameters[-1] != "base64":
        raise InvalidDataUrl("the data URL is not base64-encoded (its header does not end in ';base64')")
    if not mime.startswith("image/"):
        raise UnsupportedImageFormat(
            f"the data URL declares {mime[:40] or 'no type'!r}, which is not an image type"
        )
    # Check the encoded length first: four characters carry three bytes, so a huge string is refused unread.
    if len(payload) > 4 * -(-max_bytes // 3):
        raise ImageTooLarge(
            f"the data URL carries about {len(payload) // 4 * 3:,} bytes, over the {max_bytes:,}-byte limit"
        )
    try:
        raw = binascii.a2b_base64(payload.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise InvalidDataUrl(f"the data URL's base64 is not valid ({_reason(exc)})") from exc
    if len(raw) > max_bytes:
        raise ImageTooLarge(f"the data URL carries {len(raw):,} bytes, over the {max_bytes:,}-byte limit")
    if not raw:
        raise EmptyImage("the data URL carries no bytes")
    return mime, raw


# --- formats and headers -------------------------------------------------------------------------------

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


def _sniff_format(data: bytes, limits: ImageLimits) -> ImageFormat:
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
            f"{_LABELS[found]} images are not accepted here; send {_accepted(limits)}"
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
    names = [_LABELS[name] for name in ("JPEG", "PNG", "WEBP") if name in limits.allowed_formats]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _header_size(data: bytes, image_format: ImageFormat) -> tuple[int, int]:
    """(width, height) as the header states it, read without Pillow."""
    if image_format == "PNG":
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ImageDecodeFailed("the PNG has no IHDR header where the format requires one")
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if image_format == "WEBP":
        return _webp_size(data)
    try:
        for segment in _jpeg_segments(data):
            if segment.marker in _JPEG_FRAME_MARKERS:
                header = data[segment.start : segment.end].lstrip(b"\xff")  # marker, length, precision, size
                if len(header) < 8:
                    raise _MalformedJpeg("its frame header is too short")
                height, width = struct.unpack(">HH", header[4:8])
                return width, height
            if segment.marker in (0xDA, 0xD9):
                raise _MalformedJpeg("it has no frame header before its image data")
    except _MalformedJpeg as exc:
        raise ImageDecodeFailed(f"the JPEG is malformed: {exc}") from exc
    raise AssertionError("unreachable: _jpeg_segments ends with EOI or raises")  # pragma: no cover


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


def _check_dimensions(label: str, width: int, height: int, limits: ImageLimits) -> None:
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


# --- JPEG structure (header size and passthrough) ---------------------------------------------------------

# SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
_JPEG_FRAME_MARKERS: Final = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE_MARKERS: Final = frozenset(range(0xD0, 0xD8)) | {0x01}
_JPEG_KEPT_MARKERS: Final = frozenset({0xC0, 0xC4, 0xDA, 0xDB, 0xDD, 0xD9})  # SOF0 DHT SOS DQT DRI EOI
# APP0 of exactly 16 bytes: "JFIF\0", version, units, densities, and a 0×0 thumbnail.
_JFIF_WITHOUT_THUMBNAIL: Final = re.compile(rb"\xff+\xe0\x00\x10JFIF\x00.{7}\x00\x00\Z", re.DOTALL)


class _MalformedJpeg(Exception):
    """The marker structure of a JPEG is broken."""


@dataclass(frozen=True, slots=True)
class _JpegSegment:
    marker: int
    start: int  # offset of the segment's first 0xFF
    end: int  # offset just after it (after the entropy-coded data, for SOS)


def _jpeg_segments(data: bytes) -> Iterator[_JpegSegment]:
    """Walk a JPEG's marker segments after SOI, up to and including EOI."""
    size = len(data)
    position = 2
    while True:
        if position >= size:
            raise _MalformedJpeg("it ends before its end-of-image marker")
        if data[position] != 0xFF:
            raise _MalformedJpeg(f"a marker was expected at byte {position:,}")
        start = position
        while position < size and data[position] == 0xFF:  # fill bytes may precede a marker
            position += 1
        if position >= size:
            raise _MalformedJpeg("it ends inside a marker")
        marker = data[position]
        position += 1
        if marker == 0xD9 or marker in _JPEG_STANDALONE_MARKERS:
            yield _JpegSegment(marker, start, position)
            if marker == 0xD9:
                return
            continue
        if position + 2 > size:
            raise _MalformedJpeg("it ends inside a segment length")
        length = int.from_bytes(data[position : position + 2], "big")
        if length < 2 or position + length > size:
            raise _MalformedJpeg(f"a segment at byte {start:,} runs past the end of the data")
        position += length
        if marker == 0xDA:
            position = _entropy_coded_end(data, position)
        yield _JpegSegment(marker, start, position)


# 0xFF followed by anything but a stuffed zero, an RSTn or another fill 0xFF: the marker after a scan.
_MARKER_AFTER_SCAN: Final = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _entropy_coded_end(data: bytes, position: int) -> int:
    """Offset of the first marker after a scan's entropy-coded data (stuffed 0xFF00 and RSTn belong to it).

    One regular-expression scan at C speed: a 100 KiB scan has hundreds of 0xFF bytes to step over.
    """
    found = _MARKER_AFTER_SCAN.search(data, position)
    if found is None:
        raise _MalformedJpeg("its image data runs to the end without an end-of-image marker")
    return found.start()


def _baseline_jpeg_stream(data: bytes) -> bytes | None:
    """The JPEG without metadata and trailing bytes, if it is a plain baseline YCbCr JPEG; else None.

    Kept: SOI, a thumbnail-free JFIF APP0 (it fixes the colour space as YCbCr), DQT, SOF0, DHT, DRI, SOS and
    its data, EOI. Dropped: every other APPn (EXIF, XMP, ICC, MPF, ...) and COM, which change no pixel in
    the engine's decoder. Not eligible (None): progressive or other frame types, Adobe APP14 (its colour
    transform flag changes decoding), a JFIF thumbnail, DNL, or any marker structure out of the ordinary.
    """
    kept = [b"\xff\xd8"]
    frames = scans = 0
    try:
        for segment in _jpeg_segments(data):
            body = data[segment.start : segment.end]
            marker = segment.marker
            if marker == 0xE0 and body.lstrip(b"\xff")[3:8] == b"JFIF\x00":
                if not _JFIF_WITHOUT_THUMBNAIL.match(body):
                    return None
                kept.append(body)
            elif marker == 0xEE:
                return None
            elif 0xE0 <= marker <= 0xEF or marker == 0xFE:
                continue
            elif marker not in _JPEG_KEPT_MARKERS:
                return None
            else:
                if marker == 0xC0:
                    frames += 1
                    header = body.lstrip(b"\xff")
                    if len(header) < 9 or header[3] != 8 or header[8] != 3:  # 8-bit, 3 components
                        return None
                if marker == 0xDA:
                    scans += 1
                kept.append(body)
    except _MalformedJpeg:
        return None
    return b"".join(kept) if frames == 1 and scans >= 1 else None


# --- decoding -------------------------------------------------------------------------------------------


def _open(data: bytes, image_format: ImageFormat) -> ImageFile.ImageFile:
    """Pillow's lazy open with only the sniffed format's plugin: headers parsed, no pixel decoded."""
    try:
        return Image.open(io.BytesIO(data), formats=[image_format])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Only reachable if Pillow reads a larger size than the header check did.
        raise ImageDimensionsTooLarge(
            f"the {_LABELS[image_format]} is too large to decode ({_reason(exc)})"
        ) from exc
    except _PILLOW_DATA_ERRORS as exc:
        raise ImageDecodeFailed(
            f"the {_LABELS[image_format]} header could not be read ({_reason(exc)})"
        ) from exc


def _load(image: ImageFile.ImageFile, label: str) -> None:
    try:
        image.load()
    except _PILLOW_DATA_ERRORS as exc:
        raise ImageDecodeFailed(f"the {label} is corrupt or truncated ({_reason(exc)})") from exc


def _check_decoded_size(image: Image.Image, stored_size: tuple[int, int], label: str) -> None:
    """The pixels decoded are the size the header promised, at the DCT scale asked for (1, 1/2, 1/4, 1/8)."""
    width, height = stored_size
    promised = {(-(-width // scale), -(-height // scale)) for scale in (1, 2, 4, 8)}
    if image.size not in promised or image.im.size != image.size:
        raise ImageDecodeFailed(
            f"the {label} decoded to {image.im.size[0]}×{image.im.size[1]} pixels, not the "
            f"{width}×{height} its header states"
        )


def _check_frames(
    image: ImageFile.ImageFile, image_format: ImageFormat, label: str, limits: ImageLimits
) -> None:
    """Refuse animation unless the first frame is wanted (Pillow has already opened at frame 0)."""
    if image_format == "JPEG":
        return  # an MPO's further pictures are stereo views or previews, not animation: use the first
    frames = getattr(image, "n_frames", 1)
    if isinstance(frames, int) and frames > 1 and limits.animated == "refuse":
        raise AnimatedImage(f"the {label} is animated ({frames} frames); send one still keyframe")


def _orientation(image: Image.Image) -> int:
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


def _as_displayed(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    return (size[1], size[0]) if orientation in (5, 6, 7, 8) else size


# --- pixels ---------------------------------------------------------------------------------------------


def _resizable(image: Image.Image) -> Image.Image:
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


def _resize(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """To ``size``: RGB and grey by a box reduce and one bilinear pass, frames with alpha by Pillow's bicubic.

    The box ``reduce`` takes the integer part of the downscale, so the bilinear pass after it always spans
    less than two source pixels per output pixel and every source pixel counts.
    """
    if image.size == size:
        return image
    if image.mode not in ("RGB", "L"):
        return image.resize(size, _RESAMPLE, reducing_gap=_REDUCING_GAP)
    factors = (max(1, image.width // size[0]), max(1, image.height // size[1]))
    if factors != (1, 1):
        image = image.reduce(factors)
        if image.size == size:
            return image
    return Image.fromarray(cv2.resize(np.asarray(image), size, interpolation=cv2.INTER_LINEAR))


def _flatten_to_rgb(image: Image.Image) -> Image.Image:
    """RGB pixels; transparency composited on white, as a viewer would show it."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA"):
        rgba = image.convert("RGBA") if image.mode == "LA" else image
        return Image.alpha_composite(Image.new("RGBA", image.size, _WHITE), rgba).convert("RGB")
    return image.convert("RGB")


def _encode_jpeg(image: Image.Image, quality: int) -> bytes:
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


def _passthrough(stream: bytes, grid: TokenGrid) -> ShapedImage:
    """Reuse an on-grid baseline JPEG's bitstream, decoded once at the identity's scale to prove it decodes.

    At 1/8 scale libjpeg still reads every entropy-coded bit (truncation and corrupt data fail as in a full
    decode); it only skips the inverse DCT beyond the DC term, the 8×8 block mean the identity is made of.
    """
    with _open(stream, "JPEG") as image:
        size = image.size
        scale = _identity_scale(size)
        image.draft("RGB", (size[0] // scale, size[1] // scale))
        _load(image, "JPEG")
        _check_decoded_size(image, size, "JPEG")
        return _shaped(
            stream, size, image, grid, source=(*size, "JPEG"), decoded_size=image.size, passthrough=True
        )


def _identity_scale(size: tuple[int, int]) -> int:
    """1/8 when the frame's short side stays at least 32 pixels at that scale, else full size."""
    return IDENTITY_SCALE if min(size) >= IDENTITY_SCALE * _IDENTITY_MIN_SIDE else 1


def frame_identity(reduced: Image.Image) -> tuple[str, bytes]:
    """(pHash as 16 hex digits, 16×9 RGB thumbnail) of a frame's pixels reduced by ``_identity_scale``.

    The pHash is imagehash's ``phash`` (grey, Lanczos to 32×32, 2-D DCT-II, the 8×8 lowest frequencies
    against their median), its bits packed here rather than through its string building.
    """
    rgb = reduced if reduced.mode == "RGB" else reduced.convert("RGB")
    thumbnail = rgb.resize(THUMBNAIL_SIZE, Image.Resampling.BOX).tobytes()
    grey = np.asarray(rgb.convert("L").resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64)
    low = scipy.fftpack.dct(scipy.fftpack.dct(grey, axis=0), axis=1)[:8, :8]
    bits = np.packbits(low > np.median(low)).tobytes()
    return bits.hex(), thumbnail


def _shaped(
    data: bytes,
    size: tuple[int, int],
    reduced: Image.Image,
    grid: TokenGrid,
    *,
    source: tuple[int, int, ImageFormat],
    decoded_size: tuple[int, int],
    passthrough: bool = False,
) -> ShapedImage:
    """The shaped frame's description; ``reduced`` is its pixels at the identity's scale."""
    width, height = size
    factor = grid.pixels_per_token
    phash, thumbnail = frame_identity(reduced)
    return ShapedImage(
        data=data,
        mime=SHAPED_MIME,
        width=width,
        height=height,
        source_width=source[0],
        source_height=source[1],
        source_format=source[2],
        image_tokens=(width // factor) * (height // factor),
        sha256=hashlib.sha256(data).hexdigest(),
        phash=phash,
        thumbnail=thumbnail,
        passthrough=passthrough,
        decoded_size=decoded_size,
    )


def _reason(exc: BaseException) -> str:
    """A library's error message, short enough to hand to a client."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else f"{text[:117]}..."
