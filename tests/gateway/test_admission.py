"""The admission queue: the in-flight cap, priority order, a bounded queue and deadlines."""

from __future__ import annotations

import asyncio

import pytest

from gateway.engine.admission import AdmissionQueue
from gateway.errors import Overloaded


async def test_no_more_than_the_cap_hold_a_slot_at_once() -> None:
    queue = AdmissionQueue(max_inflight=3, queue_size=100, queue_timeout_s=5)
    holding, peak = 0, 0

    async def work() -> None:
        nonlocal holding, peak
        async with queue.slot():
            holding += 1
            peak = max(peak, holding)
            await asyncio.sleep(0.001)
            holding -= 1

    await asyncio.gather(*(work() for _ in range(40)))
    assert peak == 3
    assert queue.inflight == 0
    assert queue.peak_inflight == 3


async def test_waiters_are_served_by_priority_then_arrival() -> None:
    queue = AdmissionQueue(max_inflight=1, queue_size=10, queue_timeout_s=5)
    order: list[str] = []
    first = await queue.acquire()
    assert first.queue_seconds == 0

    async def wait(name: str, priority: int) -> None:
        async with queue.slot(priority=priority):
            order.append(name)

    tasks = [
        asyncio.create_task(wait(name, prio)) for name, prio in (("low", 5), ("high-a", -1), ("high-b", -1))
    ]
    await asyncio.sleep(0.01)
    assert queue.queued == 3
    queue.release(0.01)
    await asyncio.gather(*tasks)
    assert order == ["high-a", "high-b", "low"]


async def test_a_full_queue_answers_overloaded_with_retry_after() -> None:
    queue = AdmissionQueue(max_inflight=1, queue_size=1, queue_timeout_s=5)
    await queue.acquire()
    waiter = asyncio.create_task(queue.acquire())
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as refused:
        await queue.acquire()
    assert refused.value.code == "queue_full"
    assert int(refused.value.headers()["Retry-After"]) >= 1
    queue.release(0.1)
    await waiter


async def test_a_waiter_past_its_deadline_is_refused_and_leaves_the_queue() -> None:
    queue = AdmissionQueue(max_inflight=1, queue_size=5, queue_timeout_s=0.02)
    await queue.acquire()
    with pytest.raises(Overloaded) as refused:
        await queue.acquire()
    assert refused.value.code == "queue_timeout"
    assert queue.queued == 0
    queue.release(0.1)
    assert queue.inflight == 0


async def test_a_cancelled_waiter_does_not_leak_a_slot() -> None:
    queue = AdmissionQueue(max_inflight=1, queue_size=5, queue_timeout_s=5)
    await queue.acquire()
    waiter = asyncio.create_task(queue.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    queue.release(0.1)
    assert queue.inflight == 0
    assert queue.has_spare_capacity()


async def test_spare_capacity_is_refused_while_anyone_waits() -> None:
    queue = AdmissionQueue(max_inflight=2, queue_size=5, queue_timeout_s=5)
    assert queue.try_acquire_spare()
    await queue.acquire()
    waiter = asyncio.create_task(queue.acquire())
    await asyncio.sleep(0)
    queue.release(0.1)  # the slot goes to the waiter, not to background work
    await waiter
    assert not queue.try_acquire_spare()
