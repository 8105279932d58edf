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
(Pillow releases the GIL while it decodes, resizes and encodes), except a request's lone keyframe that
``passes_through`` says is on the grid, whose check costs less than the hand-off to a thread: the gateway
runs it on its event loop, or ``passthrough_check`` there and only the ``Passthrough``'s decode on a thread.

The package, by job, in the order a keyframe meets them: ``data_url`` (bytes out of a ``data:`` URL),
``limits`` (the formats and limits), ``header`` (steps 2 and 3: magic bytes and the header's size, by hand),
``jpeg`` (a JPEG's marker structure: its frame header, the passthrough's bitstream), ``decode`` (steps 4
and 5, and the EXIF orientation), ``pixels`` (steps 6 and 7), ``identity`` (the pHash and thumbnail),
``shape`` (``shape_image``, which runs them in order, and ``ShapedImage``). The token grid and
``smart_resize`` are ``shaping.tokens``'s.
"""

from shaping.image.data_url import data_url_payload, decode_data_url
from shaping.image.identity import IDENTITY_SCALE, THUMBNAIL_SIZE, frame_identity
from shaping.image.limits import SUPPORTED_FORMATS, ImageFormat, ImageLimits
from shaping.image.shape import (
    SHAPED_MIME,
    Passthrough,
    ShapedImage,
    passes_through,
    passthrough_check,
    shape_image,
    shape_picture,
)

__all__ = [
    "IDENTITY_SCALE",
    "SHAPED_MIME",
    "SUPPORTED_FORMATS",
    "THUMBNAIL_SIZE",
    "ImageFormat",
    "ImageLimits",
    "Passthrough",
    "ShapedImage",
    "data_url_payload",
    "decode_data_url",
    "frame_identity",
    "passes_through",
    "passthrough_check",
    "shape_image",
    "shape_picture",
]
