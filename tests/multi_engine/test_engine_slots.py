"""The cap follows the engine's own slots (llama.cpp's /props) before a slot of it is taken: on fake engines,
and across replicas in a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.engine.leases import EngineLeases
from gateway.engine.pool import EnginePool
from gateway.engine.pool_build import build_engine_pool
from gateway.http.services import redis_client
from gateway.settings import Settings

ENGINE = "http://engine-a.test"
PREFIX = "test:engine-slots"
ANSWER = {
    "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1},
}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class FakeEngine:
    """An engine that names ``slots`` in ``/props`` (None: it serves none, as vLLM) and counts the calls
    running at it; a call takes a few loop turns, so a burst overlaps."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots
        self.props_reads = 0
        self.running = 0
        self.peak = 0

    def restart(self, slots: int | None) -> None:
        """Come back with ``slots`` (between two calls: none of ours fails)."""
        self.slots, self.peak = slots, 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            self.props_reads += 1
            if self.slots is None:
                return httpx.Response(404)
            return httpx.Response(200, json={"total_slots": self.slots})
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(0.01)
        finally:
            self.running -= 1
        return httpx.Response(200, json=ANSWER)


def pool_for(engine: FakeEngine, redis: aioredis.Redis | None = None, **engine_settings: str) -> EnginePool:
    """A gateway's pool in front of ``engine`` (cap 8 unless it names its slots), leases in ``redis``."""
    settings = Settings(
        engine_url=ENGINE, max_inflight=8,
        engine=engine_settings,  # type: ignore[arg-type]  # a dict, as pydantic-settings takes the group
        leases={"key_prefix": PREFIX, "redis_timeout_s": 5},  # type: ignore[arg-type]  # the same
    )
    return build_engine_pool(settings, [ENGINE], transport=httpx.MockTransport(engine.handle), state=redis)


async def burst(pools: list[EnginePool], count: int) -> None:
    """``count`` calls at once, spread over ``pools`` (replicas) in turn."""
    async def call(pool: EnginePool) -> None:
        async with pool.slot() as held:
            await held.chat(BODY, "burst")

    await asyncio.gather(*(call(pools[index % len(pools)]) for index in range(count)))


@pytest.fixture
async def redis_clients(redis_url: str) -> AsyncIterator[Callable[[], aioredis.Redis]]:
    """Redis clients on the test Redis, one per replica, closed afterwards."""
    made: list[aioredis.Redis] = []

    def make() -> aioredis.Redis:
        made.append(redis_client(redis_url))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


async def test_an_engine_restarted_with_fewer_slots_gets_no_more_calls_than_them_from_a_burst() -> None:
    engine = FakeEngine(slots=4)
    pool = pool_for(engine)
    try:
        await burst([pool], 12)
        assert engine.peak == 4  # its slots, not the setting's 8
        engine.restart(slots=2)
        await burst([pool], 12)
        assert engine.peak == 2
        assert pool.engines[0].cap == 2
    finally:
        await pool.aclose()


async def test_an_engine_whose_slots_are_unknown_takes_one_call_until_they_are_read() -> None:
    engine = FakeEngine(slots=4)
    pool = pool_for(engine)
    slot = pool.engines[0]
    try:
        assert (slot.slots_unknown, slot.slot_cap()) == (True, 1)  # not read yet: one call is safe on any
        await burst([pool], 8)
        assert (slot.slots_unknown, slot.cap) == (True, 4)  # idle again since: unknown until the next call
        assert engine.peak == 4
    finally:
        await pool.aclose()


@pytest.mark.parametrize("kind", ["vllm", "auto"])
async def test_a_vllm_engine_is_capped_by_the_setting_and_its_props_not_read_per_call(kind: str) -> None:
    engine = FakeEngine(slots=None)
    pool = pool_for(engine, kind=kind)
    try:
        await pool.detect_engines()
        reads = engine.props_reads
        for _ in range(3):
            await burst([pool], 16)
        assert engine.peak == 8
        assert engine.props_reads == reads == (0 if kind == "vllm" else 1)
        assert not pool.engines[0].slots_unknown
    finally:
        await pool.aclose()


async def test_two_replicas_give_a_restarted_engine_no_more_than_its_new_slots(
    redis_clients: Callable[[], aioredis.Redis],
) -> None:
    engine = FakeEngine(slots=6)
    replicas = [pool_for(engine, redis_clients()) for _ in range(2)]
    try:
        await burst(replicas, 24)
        assert engine.peak == 6
        engine.restart(slots=3)
        await burst(replicas, 24)
        assert engine.peak == 3
    finally:
        for pool in replicas:
            await pool.aclose()


async def test_the_newest_begun_reading_of_an_engines_slots_caps_every_replicas_leases(
    redis_clients: Callable[[], aioredis.Redis],
) -> None:
    one, two = (EngineLeases(redis_clients(), key_prefix=PREFIX) for _ in range(2))
    try:
        stale, fresh = await one.slots_ticket(ENGINE), await two.slots_ticket(ENGINE)
        assert await two.record_slots(ENGINE, fresh, 2) == 2
        assert await one.record_slots(ENGINE, stale, 8) == 2  # begun earlier, answered later: not kept
        granted = [await one.try_acquire(ENGINE, 8, follows_slots=True) for _ in range(3)]
        assert [bool(lease) for lease in granted] == [True, True, False]  # one's own cap says 8
        assert await two.try_acquire(ENGINE, 8) is not None  # a configured cap does not follow the slots
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_fair_lease_caps_at_the_engines_recorded_slots_too(
    redis_clients: Callable[[], aioredis.Redis],
) -> None:
    leases = EngineLeases(redis_clients(), key_prefix=PREFIX)
    try:
        await leases.record_slots(ENGINE, await leases.slots_ticket(ENGINE), 1)
        assert await leases.try_acquire_fair(ENGINE, 4, "a", 1.0, follows_slots=True) is not None
        assert await leases.try_acquire_fair(ENGINE, 4, "a", 1.0, follows_slots=True) is None
    finally:
        await leases.aclose()
