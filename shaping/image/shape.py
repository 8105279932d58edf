"""One keyframe from bytes to :class:`ShapedImage`: the checks, the decode and the pixels in their order."""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass, field, replace
from typing import Final

from PIL import Image, ImageFile

from shaping.errors import EmptyImage, ImageDecodeFailed, ImageRejected, ImageTooLarge
from shaping.image.decode import (
    TRANSPOSE_FOR_ORIENTATION,
    as_displayed,
    check_decoded_size,
    check_frames,
    load_pixels,
    open_image,
    orientation_of,
)
from shaping.image.header import check_dimensions, size_from_header, sniff_format
from shaping.image.identity import frame_identity, identity_scale
from shaping.image.jpeg import (
    JPEG_FRAME_MARKERS,
    MalformedJpeg,
    baseline_jpeg_stream,
    eight_bit_three_components,
    jpeg_segments,
)
from shaping.image.limits import FORMAT_LABELS, ImageFormat, ImageLimits
from shaping.image.pixels import encode_jpeg, flatten_to_rgb, resizable, resize
from shaping.tokens import TokenGrid, smart_resize

SHAPED_MIME: Final = "image/jpeg"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapedImage:
    """A keyframe ready for the engine: JPEG bytes exactly on the token grid, with its identities.

    ``width``/``height`` and ``source_width``/``source_height`` are both as displayed (EXIF orientation
    applied). ``phash`` is imagehash's 64-bit perceptual hash and ``thumbnail`` the 16×9 RGB cell means
    (432 bytes) of the shaped pixels box-reduced 8× (the DCT's DC terms for a passthrough frame); both
    None when it was shaped without them (``identity=False``: nothing would compare it with another frame).
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
    phash: str | None
    thumbnail: bytes | None = field(repr=False)
    passthrough: bool
    decoded_size: tuple[int, int]  # the pixels the decoder produced (DCT scaling makes them fewer)
    # ``data`` in base64 when the caller's own text says it (see :meth:`reusing_encoding`), else None
    encoded: str | None = field(default=None, repr=False, compare=False)

    @property
    def data_url(self) -> str:
        """The shaped bytes as a base64 ``data:`` URL, as the engine's ``image_url`` takes them."""
        encoded = base64.b64encode(self.data).decode("ascii") if self.encoded is None else self.encoded
        return f"data:{self.mime};base64,{encoded}"

    def reusing_encoding(self, source: bytes, encoded: str) -> ShapedImage:
        """This frame with ``encoded``, the caller's base64 of ``source``, as its own, when that is exactly
        what encoding ``data`` would write: ``source`` passed through unchanged (nothing dropped) and the text
        canonical (strict base64 may still leave the last character's spare bits non-zero). Otherwise as is.

        It spares encoding an image-sized string again for the engine (the caller's was just decoded).
        """
        size = len(source)
        if not self.passthrough or size != len(self.data) or len(encoded) != 4 * -(-size // 3):
            return self
        tail = size - (size % 3 or 3)
        if base64.b64encode(source[tail:]).decode("ascii") != encoded[-4:] or source != self.data:
            return self
        return replace(self, encoded=encoded)


def shape_image(
    data: bytes, limits: ImageLimits, grid: TokenGrid, *, jpeg_quality: int = 90, identity: bool = True
) -> ShapedImage:
    """Check, decode and shape one keyframe; raises :class:`~shaping.errors.ImageRejected` if refused.

    ``identity=False`` leaves out the pHash and thumbnail (a fifth of a passed-through frame's shaping):
    for a frame that no verdict cache will look up and no other frame of its request will be compared with.
    """
    if not 1 <= jpeg_quality <= 100:
        raise ValueError(f"jpeg_quality must be within 1..100, got {jpeg_quality}")
    opened = _opened(data, limits, grid)
    with opened.image:
        passthrough = _passthrough_of(opened, data, grid)
        if passthrough is not None:
            passthrough.decode()
            return passthrough.shaped(identity=identity)
        image, label, stored_size, target = opened.image, opened.label, opened.image.size, opened.target
        if opened.image_format == "JPEG":
            # DCT-domain scaling: Pillow picks 1/2, 1/4 or 1/8 only where the result still covers the target.
            image.draft("RGB", target)
        load_pixels(image, label)
        check_decoded_size(image, stored_size, label)
        decoded_size = image.size
        orientation = orientation_of(image)
        pixels = resize(resizable(image), target)
        pixels = flatten_to_rgb(pixels)
        transpose = TRANSPOSE_FOR_ORIENTATION.get(orientation)
        if transpose is not None:
            pixels = pixels.transpose(transpose)
        source_width, source_height = as_displayed(stored_size, orientation)
        scale = identity_scale(pixels.size)
        return _shaped(
            encode_jpeg(pixels, jpeg_quality),
            pixels.size,
            (pixels.reduce(scale) if scale > 1 else pixels) if identity else None,
            grid,
            source=(source_width, source_height, opened.image_format),
            decoded_size=decoded_size,
        )


def passthrough_check(data: bytes, limits: ImageLimits, grid: TokenGrid) -> Passthrough | None:
    """``shape_image``'s checks, up to a passed-through frame's decode: the frame as a :class:`Passthrough`
    whose ``decode`` (no GIL held while libjpeg reads) may run on another thread, or None where the frame
    does not pass through (``shape_image`` shapes it). Refuses what ``shape_image`` refuses before its
    decode. The passthrough's image needs no closing (it reads from memory)."""
    opened = _opened(data, limits, grid)
    passthrough = _passthrough_of(opened, data, grid)
    if passthrough is None:
        opened.image.close()
    return passthrough


@dataclass(frozen=True, slots=True)
class _Opened:
    image: ImageFile.ImageFile
    image_format: ImageFormat
    label: str
    target: tuple[int, int]  # smart_resize's, in stored orientation


def _opened(data: bytes, limits: ImageLimits, grid: TokenGrid) -> _Opened:
    """Steps 1 to 4 (shaping/image/__init__.py): the bytes, the format, the header's size, and Pillow's open
    with its size and frames checked (the image closed again if they fail)."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # A process-wide Pillow switch: with it on, truncated frames would decode as grey and pass.
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on; image shaping refuses to run with it")
    if not data:
        raise EmptyImage("the image has no bytes")
    if len(data) > limits.max_bytes:
        raise ImageTooLarge(f"the image is {len(data):,} bytes, over the {limits.max_bytes:,}-byte limit")
    image_format = sniff_format(data, limits)
    label = FORMAT_LABELS[image_format]
    header_size = size_from_header(data, image_format)
    check_dimensions(label, *header_size, limits)

    image = open_image(data, image_format)
    try:
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
        check_frames(image, image_format, label, limits)
    except BaseException:
        image.close()
        raise
    return _Opened(image, image_format, label, target)


def _passthrough_of(opened: _Opened, data: bytes, grid: TokenGrid) -> Passthrough | None:
    """The frame as a passthrough if it is a baseline JPEG on the grid, in RGB, not rotated."""
    image = opened.image
    if opened.image_format != "JPEG" or image.size != opened.target or image.mode != "RGB":
        return None
    if orientation_of(image) != 1:
        return None
    stream = baseline_jpeg_stream(data)
    return None if stream is None else Passthrough(image, stream, image.size, grid)


def passes_through(head: bytes, grid: TokenGrid) -> bool:
    """Whether a JPEG's first bytes say its shaping is the passthrough's check alone: a baseline 8-bit
    three-component JPEG already on the token grid, with no EXIF (which may rotate it) or Adobe segment
    before its frame header. ``head`` may be the start of the file only: where the frame header is not
    within it, the answer is no. A guess for where to run the work, never a check: ``shape_image`` decides
    what it does with the whole file, and a wrong guess costs time only."""
    if not head.startswith(b"\xff\xd8\xff"):
        return False
    try:
        for segment in jpeg_segments(head):
            if segment.marker in (0xE1, 0xEE, 0xDA, 0xD9):  # EXIF, Adobe, or data before a frame header
                return False
            if segment.marker in JPEG_FRAME_MARKERS:
                body = head[segment.start : segment.end]
                if segment.marker != 0xC0 or not eight_bit_three_components(body):
                    return False
                height, width = struct.unpack(">HH", body.lstrip(b"\xff")[4:8])
                return width > 0 and height > 0 and smart_resize(width, height, grid) == (width, height)
    except (MalformedJpeg, ImageRejected):
        return False
    return False  # pragma: no cover - jpeg_segments ends with EOI (above) or raises


def shape_picture(picture: Image.Image, grid: TokenGrid, *, jpeg_quality: int = 90) -> bytes:
    """Pixels the caller decoded itself (a video's frame, as displayed) on the token grid, as the baseline
    JPEG the engine receives: :func:`shape_image` passes these bytes through as they are (no second decode,
    resize and encode), and they are a fraction of the full-size frame's."""
    pixels = flatten_to_rgb(resize(resizable(picture), smart_resize(*picture.size, grid)))
    return encode_jpeg(pixels, jpeg_quality)


@dataclass(frozen=True, slots=True)
class Passthrough:
    """An on-grid baseline JPEG whose bitstream goes to the engine as it is, decoded once at the identity's
    scale to prove it decodes.

    ``image`` is the caller's JPEG as already opened for the header checks; its scan is the bitstream's own
    byte for byte (only metadata and trailing bytes differ), so it is decoded as it is, not opened again.
    At 1/8 scale libjpeg still reads every entropy-coded bit (truncation and corrupt data fail as in a full
    decode); it only skips the inverse DCT beyond the DC term, the 8×8 block mean the identity is made of.
    """

    image: ImageFile.ImageFile
    stream: bytes
    size: tuple[int, int]  # as stored (and displayed: a passed-through frame is not rotated)
    grid: TokenGrid

    def decode(self) -> None:
        """Read every entropy-coded bit at 1/8 scale (libjpeg holds no GIL meanwhile); refused if it fails."""
        scale = identity_scale(self.size)
        self.image.draft("RGB", (self.size[0] // scale, self.size[1] // scale))
        load_pixels(self.image, "JPEG")
        check_decoded_size(self.image, self.size, "JPEG")

    def shaped(self, *, identity: bool = True) -> ShapedImage:
        """The frame's description, once :meth:`decode` has run."""
        return _shaped(
            self.stream, self.size, self.image if identity else None, self.grid,
            source=(*self.size, "JPEG"), decoded_size=self.image.size, passthrough=True,
        )


def _shaped(
    data: bytes,
    size: tuple[int, int],
    reduced: Image.Image | None,
    grid: TokenGrid,
    *,
    source: tuple[int, int, ImageFormat],
    decoded_size: tuple[int, int],
    passthrough: bool = False,
) -> ShapedImage:
    """The shaped frame's description; ``reduced``: its pixels at the identity's scale (None: no identity)."""
    width, height = size
    factor = grid.pixels_per_token
    phash, thumbnail = (None, None) if reduced is None else frame_identity(reduced)
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
