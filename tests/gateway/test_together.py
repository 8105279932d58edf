"""``together``: gather's answers in order, a lone awaitable in the caller's own task (gateway/tasks.py)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tasks import together


async def whose_task(value: int) -> tuple[int, asyncio.Task[object] | None]:
    await asyncio.sleep(0)
    return value, asyncio.current_task()


async def test_a_lone_awaitable_runs_in_the_callers_task() -> None:
    [(value, task)] = await together(whose_task(1))
    assert value == 1
    assert task is asyncio.current_task()


async def test_several_run_at_once_and_answer_in_order() -> None:
    arrived = [asyncio.Event(), asyncio.Event()]

    async def meets(me: int) -> tuple[int, asyncio.Task[object] | None]:
        arrived[me].set()
        await arrived[1 - me].wait()  # only ends if the other one runs meanwhile
        return me, asyncio.current_task()

    answers = await asyncio.wait_for(together(meets(0), meets(1), whose_task(2)), timeout=10)
    assert [value for value, _ in answers] == [0, 1, 2]
    assert all(task is not asyncio.current_task() for _, task in answers)


async def test_an_error_is_raised_as_gather_raises_it() -> None:
    async def fails() -> int:
        raise ValueError("bad frame")

    with pytest.raises(ValueError, match="bad frame"):
        await together(fails())
    with pytest.raises(ValueError, match="bad frame"):
        await together(whose_task(1), fails())
    assert await together() == []
