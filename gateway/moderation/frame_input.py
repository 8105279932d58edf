"""The frames a moderation request brings: image URLs read from its input, or frames the gateway already
holds encoded (a video job's cut JPEGs), each decoded and shaped off the event loop.

A cut frame goes in as its bytes: it is never written into a ``data:`` URL to be base64-decoded again.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from pydantic import ConfigDict

from gateway.errors import ClientError, InvalidRequest, PayloadTooLarge, UnprocessableImage, UnsupportedMedia
from gateway.moderation.remote_images import RemoteImageFetcher, is_remote_url
from gateway.moderation.shaping_pool import ShapingPool
from gateway.wire import ImageURLPart, ModerationRequest, TextPart
from shaping.errors import ImageRejected
from shaping.image import ImageLimits, ShapedImage, data_url_payload, decode_data_url, shape_image
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
) -> ShapedImage:
    """Decode and shape one frame off the event loop (fetched first if it is an allowed remote URL);
    ``identity``: with its pHash and thumbnail (``shape_image``)."""
    try:
        shape = functools.partial(shape_image, jpeg_quality=jpeg_quality, identity=identity)
        if isinstance(frame, EncodedFrame):
            return await off_loop(executor, tenant, shape, frame.data, limits, grid)
        if remote_images is not None and is_remote_url(frame):
            raw = await remote_images.fetch(frame)
            return await off_loop(executor, tenant, shape, raw, limits, grid)
        return await off_loop(executor, tenant, _shape_data_url, frame, limits, grid, jpeg_quality, identity)
    except ImageRejected as exc:
        raise image_rejection(exc) from exc


def _shape_data_url(
    url: str, limits: ImageLimits, grid: TokenGrid, jpeg_quality: int, identity: bool
) -> ShapedImage:
    """A ``data:`` URL's frame decoded and shaped, all on a shaping thread (the base64, the check that a
    passed-through frame may go on in the caller's own text: none of it on the event loop)."""
    _, raw = decode_data_url(url, limits.max_bytes)
    shaped = shape_image(raw, limits, grid, jpeg_quality=jpeg_quality, identity=identity)
    # a frame passed through unchanged goes to the engine in the caller's own base64
    return shaped.reusing_encoding(raw, data_url_payload(url))
