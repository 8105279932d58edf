"""A request's work, cancelled when its caller hangs up first (gateway/http/disconnect.py)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from litestar import Request

from gateway.http.disconnect import caller_left, cancel_on_disconnect


class Caller:
    """A request whose ``receive`` says the client left once ``leave`` is set (never, unless it is)."""

    def __init__(self) -> None:
        self.leave = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.leave.wait()
        return {"type": "http.disconnect"}

    def request(self) -> Request[Any, Any, Any]:
        return cast(Request[Any, Any, Any], self)


async def test_the_work_runs_in_the_callers_task_and_its_answer_comes_back() -> None:
    caller = Caller()
    ran_in: list[asyncio.Task[Any] | None] = []

    async def work() -> str:
        ran_in.append(asyncio.current_task())
        await asyncio.sleep(0)
        return "verdict"

    assert await cancel_on_disconnect(caller.request(), work()) == "verdict"
    assert ran_in == [asyncio.current_task()]  # no task of its own: one scheduling hop less per request
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == 1  # the watch for the hang-up is gone with the work


async def test_a_caller_that_leaves_cancels_the_work_and_is_told_apart() -> None:
    caller = Caller()
    cancelled = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def leave_soon() -> None:
        await asyncio.sleep(0.01)
        caller.leave.set()

    leaving = asyncio.ensure_future(leave_soon())
    told: list[bool] = []
    try:
        await cancel_on_disconnect(caller.request(), work())
    except asyncio.CancelledError:
        told.append(caller_left())  # the caller left: this task itself was not cancelled
    assert told == [True]
    assert cancelled.is_set()
    await leaving


async def test_a_request_task_cancelled_from_outside_is_not_taken_for_a_caller_that_left() -> None:
    caller = Caller()
    told: list[bool] = []

    async def handler() -> None:
        try:
            await cancel_on_disconnect(caller.request(), asyncio.sleep(30))
        except asyncio.CancelledError:
            told.append(caller_left())
            raise

    task = asyncio.ensure_future(handler())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert told == [False]
