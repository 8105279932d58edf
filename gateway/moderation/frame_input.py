"""The frames a moderation request brings: image URLs read from its input, or frames the gateway already
holds encoded (a video job's cut JPEGs), each decoded and shaped off the event loop.

A cut frame goes in as its bytes: it is never written into a ``data:`` URL to be base64-decoded again.
"""

from __future__ import annotations

import asyncio
import binascii
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Final, TypeVar

import pybase64
from pydantic import ConfigDict

from gateway.errors import ClientError, InvalidRequest, PayloadTooLarge, UnprocessableImage, UnsupportedMedia
from gateway.moderation.remote_images import RemoteImageFetcher, is_remote_url
from gateway.moderation.shaping_pool import ShapingPool
from gateway.wire import ImageURLPart, ModerationRequest, TextPart
from shaping.errors import ImageRejected
from shaping.image import (
    ImageLimits,
    ShapedImage,
    data_url_payload,
    decode_data_url,
    passes_through,
    passthrough_check,
    shape_image,
)
from shaping.tokens import TokenGrid

T = TypeVar("T")


class EncodedFrame:
    """A frame the gateway holds as an encoded image already (a video job's cut JPEG): shaped from its
    bytes as a posted keyframe's decoded bytes are, with no ``data:`` URL between."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class FramesRequest(ModerationRequest):
    """A moderation request the gateway makes itself (a video job's chunk): its images may be frames held
    as bytes. Never read from the wire: the routes take :class:`ModerationRequest`."""

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)

    input: list[ImageURLPart | TextPart | EncodedFrame]  # type: ignore[assignment]  # wider than the wire's: frames held as bytes too


Frame = str | EncodedFrame
"""One image of a request: its URL (``data:`` or an allowed remote one), or the bytes the gateway holds."""


def image_rejection(exc: ImageRejected) -> ClientError:
    """Translate a shaping rejection into the gateway's client error of the same status."""
    kind: type[ClientError] = {413: PayloadTooLarge, 415: UnsupportedMedia, 422: UnprocessableImage}.get(
        exc.status, InvalidRequest
    )
    return kind(str(exc), code=exc.code, param="input")


def split_input(request: ModerationRequest) -> tuple[list[Frame], list[str]]:
    """A request's images (URLs, or frames held as bytes) and its texts, each in order."""
    if isinstance(request.input, str):
        return [], [request.input]
    images: list[Frame] = []
    texts: list[str] = []
    for item in request.input:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, ImageURLPart):
            images.append(item.image_url.url)
        elif isinstance(item, TextPart):
            texts.append(item.text)
        elif isinstance(item, EncodedFrame):
            images.append(item)
    return images, texts


async def off_loop(executor: Executor, tenant: str, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on the shaping threads, in ``tenant``'s queue if the pool has one."""
    if isinstance(executor, ShapingPool):
        return await asyncio.wrap_future(executor.submit_for(tenant, function, *args))
    return await asyncio.get_running_loop().run_in_executor(executor, function, *args)


# A request's lone keyframe that passes through is checked on the event loop, not handed to a shaping
# thread: its shaping is a 1/8-scale decode (~1.5 ms for a 1088×608 q90 frame), and the hand-off and the
# GIL's trips between the threads cost two thirds as much CPU again (docs/performance.md). While the gateway
# is busy with other requests, its decode alone (libjpeg holds no GIL) goes to a shaping thread, so the loop
# serves the others meanwhile. The cap bounds how long the loop is held; anything else goes to the threads.
INLINE_MAX_BYTES: Final = 256 * 1024
_HEAD_BYTES: Final = 6 * 1024  # a JPEG's first bytes, which hold its tables and frame header
_HEAD_CHARS: Final = _HEAD_BYTES // 3 * 4  # the same in base64


async def shape_frame(
    frame: Frame,
    tenant: str,
    *,
    executor: Executor,
    limits: ImageLimits,
    grid: TokenGrid,
    jpeg_quality: int,
    remote_images: RemoteImageFetcher | None,
    identity: bool = True,
    lone: bool = False,
    busy: bool = False,
) -> ShapedImage:
    """Decode and shape one frame (fetched first if it is an allowed remote URL): on a shaping thread, or on
    the event loop when it is its request's ``lone`` frame and passes through (``INLINE_MAX_BYTES``), its
    decode on a thread while the gateway is ``busy``; ``identity``: with its pHash and thumbnail."""
    try:
        shape = functools.partial(shape_image, jpeg_quality=jpeg_quality, identity=identity)
        if isinstance(frame, EncodedFrame):
            raw = frame.data
        elif remote_images is not None and is_remote_url(frame):
            raw = await remote_images.fetch(frame)
        elif lone and _passes_through_inline(frame, grid):
            _, raw = decode_data_url(frame, limits.max_bytes)
            shaped = await _passed_through(raw, shape, tenant, executor, limits, grid, identity, busy)
            # a frame passed through unchanged goes to the engine in the caller's own base64
            return shaped.reusing_encoding(raw, data_url_payload(frame))
        else:  # a data: URL, decoded on the thread that shapes it
            arguments = (frame, limits, grid, jpeg_quality, identity)
            return await off_loop(executor, tenant, _shape_data_url, *arguments)
        if lone and _bytes_pass_through_inline(raw, grid):
            return await _passed_through(raw, shape, tenant, executor, limits, grid, identity, busy)
        return await off_loop(executor, tenant, shape, raw, limits, grid)
    except ImageRejected as exc:
        raise image_rejection(exc) from exc


Shape = Callable[[bytes, ImageLimits, TokenGrid], ShapedImage]  # ``shape_image`` with its settings bound


async def _passed_through(
    raw: bytes, shape: Shape, tenant: str, executor: Executor, limits: ImageLimits, grid: TokenGrid,
    identity: bool, busy: bool,
) -> ShapedImage:
    """A frame whose first bytes say it passes through, checked on the loop: all of it (``shape``) while the
    gateway is otherwise idle, its decode on a shaping thread while it is ``busy``."""
    if not busy:
        return shape(raw, limits, grid)
    passthrough = passthrough_check(raw, limits, grid)
    if passthrough is None:  # its first bytes said so, the whole file does not: shaped in full, on a thread
        return await off_loop(executor, tenant, shape, raw, limits, grid)
    await off_loop(executor, tenant, passthrough.decode)
    return passthrough.shaped(identity=identity)


def _bytes_pass_through_inline(raw: bytes, grid: TokenGrid) -> bool:
    """Whether an image held as bytes is small enough and its first bytes say it passes through."""
    return len(raw) <= INLINE_MAX_BYTES and passes_through(raw[:_HEAD_BYTES], grid)


def _passes_through_inline(url: str, grid: TokenGrid) -> bool:
    """Whether a ``data:`` URL's image is small enough and its first bytes say it passes through."""
    start = url.find(",", 0, 300) + 1
    if start == 0 or (len(url) - start) // 4 * 3 > INLINE_MAX_BYTES:
        return False
    try:
        head = pybase64.b64decode(url[start : start + _HEAD_CHARS], validate=True)
    except (binascii.Error, ValueError):
        return False  # the shaping thread's decoding says what is wrong with it
    return passes_through(head, grid)


def _shape_data_url(
    url: str, limits: ImageLimits, grid: TokenGrid, jpeg_quality: int, identity: bool
) -> ShapedImage:
    """A ``data:`` URL's frame decoded and shaped, all on a shaping thread: the base64, the shaping, the
    check that a passed-through frame may go on in the caller's own text."""
    _, raw = decode_data_url(url, limits.max_bytes)
    shaped = shape_image(raw, limits, grid, jpeg_quality=jpeg_quality, identity=identity)
    # a frame passed through unchanged goes to the engine in the caller's own base64
    return shaped.reusing_encoding(raw, data_url_payload(url))
