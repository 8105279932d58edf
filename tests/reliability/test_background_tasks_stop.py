"""A background task stops when asked, even when its cancellation is lost on the way (real Redis).

CI once hung 300 s in an archive run: the lease renewal was cancelled while redis-py read the answer to its
EXTEND, the cancellation never reached the loop, and ``await renewing`` waited for ever.
:func:`gateway.tasks.stop` cancels again until the task has ended.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.lock import Lock
from redis.exceptions import LockError

import gateway.decisions.log as decision_log
from gateway.decisions.log import RedisDecisionLog
from gateway.settings import DecisionSettings
from gateway.tasks import stop

ROUNDS = 60
ARCHIVE_ROUNDS = 150
BOUND_S = 5.0  # a stopped task ends well inside this; one that hangs never does


def patient_client(url: str) -> aioredis.Redis:
    """A client that waits 2 minutes for an answer (the service's waits 5 s): a lost cancellation then
    hangs for longer than ``BOUND_S``, where with the service's client the lease would lapse first."""
    return aioredis.Redis.from_url(url, socket_timeout=120)


def test_a_loop_that_survives_its_first_cancellation_is_still_stopped() -> None:
    """The planted defect: the first cancellation comes back as an error the loop carries on after."""
    turns: list[int] = []

    async def survives_one_cancel() -> None:
        survived = False
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if survived:
                    raise
                survived = True  # as redis-py's swallowed cancellation: the loop thinks Redis failed
            turns.append(1)

    async def scenario() -> bool:
        task = asyncio.create_task(survives_one_cancel())
        await asyncio.sleep(0.05)
        await asyncio.wait({asyncio.create_task(stop(task))}, timeout=BOUND_S)
        return task.cancelled()

    assert asyncio.run(scenario())
    assert turns  # it ran, and ran on after the first cancel


def test_a_loop_stopped_while_it_stops_its_own_helper_still_sees_the_helper_end() -> None:
    """A loop's ``finally`` stops its helper (as the job worker's freshness task) while the loop is itself
    being stopped, cancelled again every 50 ms: the helper, which survives its first five cancellations,
    still ends before the loop does, and the loop still ends cancelled."""

    async def survives_five_cancels() -> None:
        survived = 0
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                survived += 1
                if survived > 5:
                    raise

    async def scenario() -> tuple[bool, bool]:
        helper = asyncio.create_task(survives_five_cancels())

        async def loop() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                await stop(helper)

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.05)
        await asyncio.wait({asyncio.create_task(stop(task))}, timeout=BOUND_S)
        ended = task.cancelled(), helper.done()
        await stop(helper)  # (a helper left running would hang asyncio.run's own clean-up)
        return ended

    assert asyncio.run(scenario()) == (True, True)


def test_a_renewal_cancelled_mid_command_is_stopped_every_time(redis_url: str) -> None:
    """A lock's renewal loop, as the archive's and the engine leases' are, stopped at a random moment of its
    EXTEND round trips, ``ROUNDS`` times: every stop ends (one cancel and an await hung in about one round
    of three here)."""

    async def renew(lock: Lock) -> None:
        while True:
            await asyncio.sleep(0)
            try:
                await lock.extend(1.0, replace_ttl=True)
            except LockError:
                return
            except (ConnectionError, TimeoutError, OSError):
                continue  # Redis trouble: a renewal loop carries on

    async def scenario() -> int:
        client = patient_client(redis_url)
        stopped = 0
        try:
            for _ in range(ROUNDS):
                lock = client.lock("test:stop:lock", timeout=1.0)
                assert await lock.acquire(blocking=False)
                task = asyncio.create_task(renew(lock))
                await asyncio.sleep(random.random() * 0.002)
                await asyncio.wait({asyncio.create_task(stop(task))}, timeout=BOUND_S)
                stopped += task.done()
                await client.delete("test:stop:lock")
        finally:
            await client.aclose()
        return stopped

    assert asyncio.run(scenario()) == ROUNDS


def test_archive_runs_whose_lease_renews_every_two_milliseconds_all_end(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision archive under a 6-ms lease (renewed every 2 ms), its files written in 0 to 10 ms: a run's
    end often stops the renewal in the middle of its EXTEND, and every run ends (on the code before, a round
    hung for 3 to 23 s, about one in 30)."""
    settings = DecisionSettings(stream="test:stop:decisions", archive_dir=tmp_path, archive_after_s=0)
    write_files = decision_log._archive_files

    def a_moment_then_write(*args: Any) -> None:
        time.sleep(random.random() * 0.01)
        write_files(*args)

    monkeypatch.setattr(decision_log, "_archive_files", a_moment_then_write)

    async def scenario() -> int:
        client = patient_client(redis_url)
        try:
            log = RedisDecisionLog(client, settings, archive_lease_s=0.006)
            ended = 0
            for _ in range(ARCHIVE_ROUNDS):
                run = asyncio.create_task(log.archive())
                done, _ = await asyncio.wait({run}, timeout=BOUND_S)  # wait_for would wait out a hang
                if not done:
                    break
                ended += 1
            await stop(run)
            return ended
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == ARCHIVE_ROUNDS


@pytest.fixture(autouse=True)
def _seeded() -> None:
    random.seed(20261206)
