"""The admission queue shares engine slots between tenants by weight and by work, keeps each tenant's own
priorities, lets an idle tenant's share go to the others without banking it, and pushes out the largest
tenant's waiter when the queue is full."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.engine.admission import AdmissionQueue
from gateway.engine.fairness import Work
from gateway.errors import Overloaded


class RecordingEngine:
    """One slot; records which tenant started each call and the work it charged, in order."""

    def __init__(self, queue: AdmissionQueue) -> None:
        self.queue = queue
        self.started: list[str] = []
        self.work: dict[str, float] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def submit(self, tenant: str, cost: float = 1.0, priority: int = 0, actual: float | None = None,
               name: str | None = None) -> None:
        async def call() -> None:
            try:
                async with self.queue.slot(priority, work=Work(tenant, cost)) as admission:
                    self.started.append(name or tenant)
                    self.work[tenant] = self.work.get(tenant, 0.0) + (cost if actual is None else actual)
                    await asyncio.sleep(0)
                    if actual is not None:
                        self.queue.settle(admission.ticket, actual)
            except Overloaded:
                self.started.append(f"refused:{name or tenant}")

        self.tasks.append(asyncio.create_task(call()))

    async def run(self) -> None:
        await asyncio.gather(*self.tasks)


async def backlogged(weights: dict[str, float], per_tenant: int, costs: dict[str, float] | None = None,
                     ) -> RecordingEngine:
    """Every tenant queues ``per_tenant`` calls behind a held slot; then the slot frees and all run."""
    queue = AdmissionQueue(1, 1000, 60, weight=lambda tenant: weights.get(tenant, 1.0))
    engine = RecordingEngine(queue)
    plug = await queue.acquire()
    for tenant in weights:
        for _ in range(per_tenant):
            engine.submit(tenant, (costs or {}).get(tenant, 1.0))
    await asyncio.sleep(0)
    assert queue.queued == per_tenant * len(weights)
    queue.release(0.0, plug.ticket)
    await engine.run()
    return engine


async def test_two_tenants_share_slots_by_their_weights() -> None:
    engine = await backlogged({"a": 2.0, "b": 1.0}, per_tenant=40)
    first = Counter(engine.started[:30])  # while both are still waiting
    assert abs(first["a"] - 20) <= 1, first
    assert abs(first["b"] - 10) <= 1, first


async def test_three_tenants_share_slots_by_their_weights() -> None:
    engine = await backlogged({"a": 3.0, "b": 2.0, "c": 1.0}, per_tenant=40)
    first = Counter(engine.started[:36])
    assert abs(first["a"] - 18) <= 1, first
    assert abs(first["b"] - 12) <= 1, first
    assert abs(first["c"] - 6) <= 1, first


async def test_the_share_is_counted_in_engine_work_not_in_turns() -> None:
    # a thinking-on tenant's calls cost ten times a thinking-off tenant's: equal weights, equal work
    engine = await backlogged({"on": 1.0, "off": 1.0}, per_tenant=60, costs={"on": 10.0, "off": 1.0})
    first = Counter(engine.started[:44])
    assert abs(first["off"] - 40) <= 2, first
    assert abs(first["on"] - 4) <= 1, first


async def test_a_call_that_took_more_than_estimated_is_charged_its_real_work() -> None:
    queue = AdmissionQueue(1, 1000, 60)
    engine = RecordingEngine(queue)
    plug = await queue.acquire()
    for _ in range(30):
        engine.submit("a", cost=1.0, actual=5.0)  # estimated cheap, turned out five times dearer
        engine.submit("b", cost=1.0, actual=1.0)
    await asyncio.sleep(0)
    queue.release(0.0, plug.ticket)
    await engine.run()
    first = Counter(engine.started[:24])
    assert first["b"] >= 3 * first["a"], first
    assert queue.figures()["a"].work_served == pytest.approx(150.0)


async def test_a_tenant_alone_gets_every_slot() -> None:
    queue = AdmissionQueue(2, 1000, 60)
    engine = RecordingEngine(queue)
    for _ in range(20):
        engine.submit("busy")
    await engine.run()
    assert engine.started == ["busy"] * 20
    assert queue.peak_inflight == 2


async def test_an_idle_tenant_banks_no_credit_for_when_it_comes_back() -> None:
    queue = AdmissionQueue(1, 1000, 60)
    engine = RecordingEngine(queue)
    engine.submit("quiet")  # one call long ago
    await engine.run()
    plug = await queue.acquire()
    for _ in range(40):
        engine.submit("busy")
    await asyncio.sleep(0)
    queue.release(0.0, plug.ticket)
    while len(engine.started) < 21:  # noqa: ASYNC110 - stepping the loop one call at a time, no waiting
        await asyncio.sleep(0)  # "busy" alone for 20 calls: the quiet tenant's share goes to it
    for _ in range(20):
        engine.submit("quiet")  # back: served about every other turn, not 20 in a row
    await engine.run()
    after = engine.started[21:41]
    assert abs(after.count("quiet") - 10) <= 2, after
    longest_run = max(len(run) for run in "".join("q" if t == "quiet" else " " for t in after).split())
    assert longest_run <= 2, after


async def test_priorities_order_only_the_tenants_own_queue() -> None:
    queue = AdmissionQueue(1, 1000, 60)
    engine = RecordingEngine(queue)
    plug = await queue.acquire()
    engine.submit("a", priority=5, name="a-background")
    engine.submit("a", priority=0, name="a-live")
    engine.submit("a", priority=-1, name="a-escalation")
    for index in range(3):
        engine.submit("b", priority=-10, name=f"b-{index}")  # b's urgency does not buy it a larger share
    await asyncio.sleep(0)
    queue.release(0.0, plug.ticket)
    await engine.run()
    own_order = [name for name in engine.started if name.startswith("a")]
    assert own_order == ["a-escalation", "a-live", "a-background"]
    assert engine.started[:2].count("b-0") + engine.started[:2].count("a-escalation") == 2
    assert Counter(name[0] for name in engine.started[:4]) == {"a": 2, "b": 2}


async def test_fifo_serves_by_arrival_whoever_the_tenant() -> None:
    queue = AdmissionQueue(1, 1000, 60, fairness="fifo")
    engine = RecordingEngine(queue)
    plug = await queue.acquire()
    for _ in range(10):
        engine.submit("flood")
    engine.submit("quiet")
    await asyncio.sleep(0)
    queue.release(0.0, plug.ticket)
    await engine.run()
    assert engine.started == ["flood"] * 10 + ["quiet"]


async def test_a_full_queue_pushes_out_the_largest_tenants_last_waiter() -> None:
    queue = AdmissionQueue(1, 4, 60)
    engine = RecordingEngine(queue)
    plug = await queue.acquire()
    for index in range(4):
        engine.submit("flood", name=f"flood-{index}")
    await asyncio.sleep(0)
    engine.submit("quiet")  # the queue is full of flood: its newest waiter makes room
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as refused:
        await queue.acquire(work=Work("flood", 1.0))  # the flood itself is refused when full
    assert refused.value.code == "queue_full"
    queue.release(0.0, plug.ticket)
    await engine.run()
    assert "refused:flood-3" in engine.started
    granted = [name for name in engine.started if not name.startswith("refused")]
    assert granted.index("quiet") <= 1  # waited for about one slot, not for the flood's backlog
    assert queue.queued == 0
    assert queue.inflight == 0


async def test_a_waiter_that_times_out_leaves_its_tenants_queue() -> None:
    queue = AdmissionQueue(1, 10, 0.02)
    plug = await queue.acquire(work=Work("a", 1.0))
    with pytest.raises(Overloaded):
        await queue.acquire(work=Work("b", 1.0))
    assert queue.queued == 0
    assert queue.figures()["b"].queued == 0
    queue.release(0.0, plug.ticket)
    assert queue.inflight == 0
    assert queue.figures()["a"].inflight == 0
