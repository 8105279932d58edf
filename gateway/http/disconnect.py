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
    cancellation is raised here then, as :func:`caller_left` tells from this task's own.

    The work runs in this task, in place; only the watch for the hang-up is a task of its own, cancelled when
    the work ends (a task for the work and a wait on both were a tenth of a millisecond per request)."""
    this = asyncio.current_task()
    assert this is not None  # called from a request's task
    left = False

    async def disconnected() -> None:
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        this.cancel()

    watcher = asyncio.ensure_future(disconnected())
    try:
        return await work
    except asyncio.CancelledError:
        if left:  # the caller's leaving, not a cancellation of this task: caller_left() tells them apart
            this.uncancel()
        raise
    finally:
        watcher.cancel()


def caller_left() -> bool:
    """In an ``except CancelledError`` around :func:`cancel_on_disconnect`: whether it was the work that was
    cancelled because the caller left (this task itself is not being cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0
