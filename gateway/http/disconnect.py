"""A request's work, cancelled when its caller hangs up first (the gateway's routes, and the simulator's
whole answers, which leave the engine then as vLLM's and llama-server's do)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

T = TypeVar("T")


async def cancel_on_disconnect(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Run ``work``; if the client goes away first, cancel it (and with it the engine request): the
    cancellation is raised here then, as :func:`caller_left` tells from this task's own."""
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


def caller_left() -> bool:
    """In an ``except CancelledError`` around :func:`cancel_on_disconnect`: whether it was the work that was
    cancelled because the caller left (this task itself is not being cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0
