"""Why an image was refused: one exception tree, each class with a machine code and an HTTP status.

ImageRejected                      the client sent an image the gateway will not shape
├── ImageTooLarge                  413 image_too_large: more bytes than the limit
├── ImageDimensionsTooLarge        413 image_dimensions_too_large: the header claims too many pixels
├── UnsupportedImageFormat         415 unsupported_image_format: not JPEG, PNG or WebP (or not allowed)
├── ImageDecodeFailed              400 image_decode_failed: truncated, corrupt or malformed
├── EmptyImage                     400 empty_image: no bytes, or an image with no pixels
├── InvalidDataUrl                 400 invalid_data_url: not a strict base64 ``data:`` URL
├── AnimatedImage                  422 animated_image: more than one frame while animation is refused
└── ImageAspectRatioTooLarge       422 image_aspect_ratio_too_large: longer than 200:1, as the model refuses

The library never maps these to HTTP itself: the gateway does that in its one handler. The status is here
so that every caller answers the same problem the same way. Messages say what was wrong in plain words and
never echo more than a few characters of what the client sent.
"""

from __future__ import annotations

from typing import ClassVar


class ImageRejected(Exception):
    """The client sent an image the gateway will not shape; ``code`` and ``status`` say how to answer."""

    code: ClassVar[str] = "invalid_image"
    status: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ImageTooLarge(ImageRejected):
    """More bytes than the configured limit (the file, or the payload of a data URL)."""

    code = "image_too_large"
    status = 413


class ImageDimensionsTooLarge(ImageRejected):
    """The header claims more pixels, or a longer side, than the limits: refused before any decoding."""

    code = "image_dimensions_too_large"
    status = 413


class UnsupportedImageFormat(ImageRejected):
    """Not one of the allowed formats, judged by the bytes themselves (never by a declared type)."""

    code = "unsupported_image_format"
    status = 415


class ImageDecodeFailed(ImageRejected):
    """Truncated, corrupt or malformed image data."""

    code = "image_decode_failed"
    status = 400


class EmptyImage(ImageRejected):
    """No bytes at all, or a header that describes an image without pixels."""

    code = "empty_image"
    status = 400


class InvalidDataUrl(ImageRejected):
    """Not a ``data:`` URL, not base64, or base64 that is not strictly valid."""

    code = "invalid_data_url"
    status = 400


class AnimatedImage(ImageRejected):
    """More than one frame while the limits refuse animation: a keyframe is one still picture."""

    code = "animated_image"
    status = 422


class ImageAspectRatioTooLarge(ImageRejected):
    """Longer than 200:1, which Qwen-VL processors refuse; refused here so the engine never sees it."""

    code = "image_aspect_ratio_too_large"
    status = 422


def short_reason(exc: BaseException) -> str:
    """A library's error message, short enough to hand to a client."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else f"{text[:117]}..."
