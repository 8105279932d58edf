"""The shaping threads: a flood's frames waiting for a thread do not hold a quiet tenant's frame back."""

from __future__ import annotations

import asyncio
import itertools
import threading
from concurrent.futures import Future

import pytest

from gateway.moderation.shaping_pool import ShapingPool


def flood_then_quiet(pool: ShapingPool, flood: int) -> list[str]:
    """Hold the one thread, queue ``flood`` tasks of one tenant then one of another; the order they ran."""
    ran: list[str] = []
    gate = threading.Event()
    held = pool.submit_for("flood", gate.wait)
    futures: list[Future[None]] = [pool.submit_for("flood", ran.append, "flood") for _ in range(flood)]
    futures.append(pool.submit_for("quiet", ran.append, "quiet"))
    gate.set()
    held.result(timeout=30)
    for future in futures:
        future.result(timeout=30)
    return ran


def test_a_quiet_tenants_frame_waits_for_about_one_thread_not_the_flood() -> None:
    pool = ShapingPool(1)
    try:
        ran = flood_then_quiet(pool, flood=30)
    finally:
        pool.shutdown()
    assert ran.index("quiet") <= 1, ran
    assert len(ran) == 31


def test_fifo_makes_the_quiet_tenant_wait_behind_the_flood() -> None:
    pool = ShapingPool(1, fairness="fifo")
    try:
        ran = flood_then_quiet(pool, flood=30)
    finally:
        pool.shutdown()
    assert ran[-1] == "quiet"


def test_thread_time_is_shared_by_weight() -> None:
    ticks = itertools.count()  # every task is charged one tick: the share is the weights' alone
    pool = ShapingPool(1, weight=lambda tenant: 3.0 if tenant == "heavy" else 1.0, clock=lambda: next(ticks))
    ran: list[str] = []
    gate = threading.Event()
    try:
        held = pool.submit_for("other", gate.wait)
        futures = [
            pool.submit_for(tenant, ran.append, tenant) for _ in range(40) for tenant in ("heavy", "light")
        ]
        gate.set()
        held.result(timeout=30)
        for future in futures:
            future.result(timeout=30)
    finally:
        pool.shutdown()
    first = ran[:20]  # both still waiting: three "heavy" tasks to one "light"
    assert abs(first.count("heavy") - 15) <= 1, first


async def test_it_serves_run_in_executor_and_passes_errors_back() -> None:
    pool = ShapingPool(2)
    try:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(pool, sum, [1, 2, 3]) == 6
        with pytest.raises(ZeroDivisionError):
            await asyncio.wrap_future(pool.submit_for("a", divmod, 1, 0))
        assert pool.queued() == {}
    finally:
        pool.shutdown()


def test_a_cancelled_waiting_task_never_runs() -> None:
    pool = ShapingPool(1)
    ran: list[str] = []
    gate = threading.Event()
    try:
        held = pool.submit_for("a", gate.wait)
        doomed = pool.submit_for("a", ran.append, "doomed")
        kept = pool.submit_for("a", ran.append, "kept")
        assert doomed.cancel()
        gate.set()
        held.result(timeout=30)
        kept.result(timeout=30)
    finally:
        pool.shutdown()
    assert ran == ["kept"]


def test_a_task_is_off_the_books_and_the_next_on_its_way_before_its_caller_hears() -> None:
    """The pool settles a finished task (its count, its charge, the next task handed out) before it tells the
    caller: a caller woken by the result finds the thread's lock free, and the thread already free."""
    pool = ShapingPool(1)
    try:
        gate = threading.Event()
        first = pool.submit_for("a", gate.wait)
        second = pool.submit_for("b", lambda: None)
        seen: list[bool] = []
        first.add_done_callback(lambda _: seen.append(second.running() or second.done()))
        gate.set()
        first.result(timeout=30)
        second.result(timeout=30)
    finally:
        pool.shutdown()
    assert seen == [True]
