"""Stopping a background task, even one whose cancellation gets lost on the way; awaiting several at once.

``task.cancel()`` and an ``await`` of the task can hang forever: redis-py (8.1) turns a cancellation that
lands while it writes a command into ``ConnectionError`` ("Connection lost"), and the gateway's background
loops (lease renewals, followers, archivers) survive Redis errors by design, so such a loop catches the
error and runs on (Python 3.11's ``asyncio.timeout``, inside redis-py, can turn a cancellation that lands as
its deadline passes into ``TimeoutError`` as well). :func:`stop` cancels once, gives the task a moment to
clean up, then cancels again at every turn until it ends: the next ``await`` the loop reaches (its sleep,
its next command) ends it, as anyio's level-triggered cancel scopes do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_GRACE_S = 0.25  # what the first cancellation is given: a task's own clean-up (a last Redis call)
RECANCEL_S = 0.05  # then, how long each further cancellation is given before the next


async def stop(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task and wait until it has ended; an error one ended with (before or as it was stopped:
    the cancellation may come back as one) is logged, not raised, so a shutdown goes on.

    Called where the caller is being stopped itself (a loop's ``finally`` stopping its helper, while
    :func:`stop` cancels the loop again and again), a cancellation of the caller does not cut the wait short:
    the tasks are still seen to their end, then the caller's cancellation goes on."""
    running = {task for task in tasks if task is not None}
    grace_s = FIRST_GRACE_S
    interrupted: asyncio.CancelledError | None = None
    while pending := {task for task in running if not task.done()}:
        for task in pending:
            task.cancel()
        try:
            await asyncio.wait(pending, timeout=grace_s)
        except asyncio.CancelledError as exc:  # our caller is stopped: ours first, then it
            interrupted = exc
        grace_s = RECANCEL_S
    for task in running:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("the background task %s ended with %r", task.get_name(), error)
    if interrupted is not None:
        raise interrupted


async def together(*awaitables: Awaitable[T]) -> list[T]:
    """``asyncio.gather(*awaitables)`` as a list; a lone one (a request of one keyframe, as most are) awaited
    in place, without a task made for it: on the moderation path, gather's tasks were a part of every call."""
    if len(awaitables) == 1:
        return [await awaitables[0]]
    return list(await asyncio.gather(*awaitables))
