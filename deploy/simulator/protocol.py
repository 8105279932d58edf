"""Requests in vLLM's protocol: the chat request's fields, its images as the engine sees them, its errors."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deploy.keyframes import Label, read_label
from deploy.simulator.tokenizer import ImageSlot
from gateway.http.disconnect import caller_left, cancel_on_disconnect
from shaping.errors import ImageRejected
from shaping.tokens import TokenGrid, image_tokens


class EngineError(HTTPException):
    """An error in vLLM's OpenAI shape."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(status_code=status, detail=message)
        self.param = param


CLIENT_CLOSED = 499  # nginx's code for a caller gone before its answer: nobody reads it


async def unless_caller_leaves(
    request: Request[Any, Any, Any], answer: Awaitable[Response[Any]]
) -> Response[Any]:
    """A whole (non-streamed) answer, abandoned when its caller hangs up first: the sequence leaves the engine
    then, as on the real servers (vLLM's ``with_cancellation`` on its OpenAI routes, llama-server's
    ``is_connection_closed`` while it waits for a task's results). Without this a request the gateway gave
    up on (its deadline passed) stayed in the simulated batch until its last token, beside the gateway's next
    one: more requests at the engine than the gateway's cap let in."""
    try:
        return await cancel_on_disconnect(request, answer)  # its generator's ``finally`` aborts the sequence
    except asyncio.CancelledError:
        if not caller_left():
            raise
        return Response(None, status_code=CLIENT_CLOSED)


class ChatRequest(BaseModel):
    """The fields of vLLM's chat request that the simulator reads; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # as vLLM: no model means the served one
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = 0
    thinking_token_budget: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM's default --max-logprobs is 20


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """An image as the engine sees it: identity, label and token count."""

    identity: str
    tokens: int
    label: Label


def decode_image(url: str, explicit_uuid: str | None, grid: TokenGrid) -> DecodedImage:
    if not url.startswith("data:"):
        raise EngineError(400, "only data: image URLs are supported by this engine", "messages")
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise EngineError(400, "image data URL must be base64-encoded", "messages")
    try:
        raw = base64.b64decode(payload, validate=True)
        with Image.open(io.BytesIO(raw)) as image:
            image.load()
            width, height = image.size
            label = read_label(image)
    except (binascii.Error, UnidentifiedImageError, OSError, ValueError) as exc:
        raise EngineError(400, f"failed to load image: {exc}", "messages") from exc
    identity = explicit_uuid or f"{zlib.crc32(raw):08x}-{len(raw)}"
    try:
        tokens = image_tokens(width, height, grid)
    except ImageRejected as exc:  # e.g. an aspect ratio over 200:1, which the model's processor refuses
        raise EngineError(400, f"failed to process image: {exc}", "messages") from exc
    return DecodedImage(identity=identity, tokens=tokens, label=label)


def user_parts(content: Any, grid: TokenGrid) -> tuple[list[ImageSlot | str], list[DecodedImage]]:
    if isinstance(content, str):
        return [content], []
    if not isinstance(content, list):
        raise EngineError(400, "message content must be a string or a list of parts", "messages")
    parts: list[ImageSlot | str] = []
    images: list[DecodedImage] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(str(part.get("text", "")))
        elif kind == "image_url":
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else None
            if not isinstance(url, str):
                raise EngineError(400, "image_url.url is required", "messages")
            image = decode_image(url, part.get("uuid"), grid)
            images.append(image)
            parts.append("<|vision_start|>")
            parts.extend(ImageSlot(image.identity, i) for i in range(image.tokens))
            parts.append("<|vision_end|>")
        else:
            raise EngineError(400, f"unsupported content part type {kind!r}", "messages")
    return parts, images


def parse_chat(body: bytes | dict[str, Any], served_model: str) -> ChatRequest:
    """The chat request as vLLM validates it: a bad field is a 400, a model not served a 404."""
    try:
        if isinstance(body, dict):
            request = ChatRequest.model_validate(body)
        else:
            request = ChatRequest.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise EngineError(400, f"{param}: {first.get('msg')}", param) from exc
    if request.model is not None and request.model != served_model:
        raise EngineError(404, f"The model `{request.model}` does not exist.", "model")
    if request.stream_options is not None and not request.stream:
        raise EngineError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    return request
