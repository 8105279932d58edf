"""``POST /v1/moderations``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar.di import NamedDependency
from litestar import Request, post
from litestar.params import JSONBody

from gateway.errors import InvalidRequest
from gateway.policy import Mode
from gateway.services import Services
from gateway.wire import ModerationRequest, ModerationResponse

T = TypeVar("T")


async def cancel_on_disconnect(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Run ``work``; if the client goes away first, cancel it (and with it the engine request)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    return await task


def requested_mode(value: str | None) -> Mode | None:
    """``X-Modgate-Thinking: on|off``."""
    if value is None:
        return None
    if value not in ("on", "off"):
        raise InvalidRequest("X-Modgate-Thinking must be 'on' or 'off'", param="X-Modgate-Thinking")
    return "on" if value == "on" else "off"


@post("/v1/moderations", status_code=200)
async def create_moderation(
    request: Request[Any, Any, Any], data: JSONBody[ModerationRequest], services: NamedDependency[Services]
) -> ModerationResponse:
    """Moderate keyframes: the OpenAI moderation request and response, one result per image."""
    caller = services.keys.caller(request.headers.get("authorization"))
    requested = requested_mode(request.headers.get("x-modgate-thinking"))
    max_images = services.settings.shaping.max_images_per_request
    if isinstance(data.input, list) and len(data.input) > max_images:
        raise InvalidRequest(f"at most {max_images} inputs per request, got {len(data.input)}", param="input")
    return await cancel_on_disconnect(request, services.moderation.moderate(data, caller, requested))


ROUTES = [create_moderation]
