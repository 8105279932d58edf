"""One fair share across replicas, decided in a real Redis with the lease: a free engine slot goes to the
waiting tenant served least (per weight) on whichever replica it waits, not to the replica that asks first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from gateway.engine.leases import EngineLeases
from gateway.http.services import redis_client

ENGINE = "http://engine-fair.test"
PREFIX = "test:fair-leases"


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[Callable[[str], EngineLeases]]:
    """``replicas(name)``: lease holders on the test Redis, each on a client of its own as replicas are."""
    made: list[tuple[EngineLeases, aioredis.Redis]] = []

    def make(name: str) -> EngineLeases:
        client = redis_client(redis_url)
        leases = EngineLeases(client, key_prefix=PREFIX, replica=name)
        made.append((leases, client))
        return leases

    yield make
    for leases, client in made:
        await leases.aclose()
        await client.aclose()


async def test_a_freed_slot_goes_to_the_quiet_tenant_on_another_replica_though_the_flood_asks_first(
    replicas: Callable[[str], EngineLeases],
) -> None:
    a, b = replicas("replica-a"), replicas("replica-b")
    flood = [await a.try_acquire_fair(ENGINE, 2, "flood", 1000.0) for _ in range(2)]
    assert all(flood)  # the flood holds both slots
    assert await a.try_acquire_fair(ENGINE, 2, "flood", 1000.0) is None  # full: the flood waits
    assert await b.try_acquire_fair(ENGINE, 2, "quiet", 1000.0) is None  # full: quiet waits, on replica b

    lease = flood[0]
    assert lease is not None
    await a.release(ENGINE, lease)
    # The flood's replica asks first for the freed slot, and is refused: the quiet tenant waits elsewhere
    # with less work served (lifted to the flood's level on arrival, and holding no slot: the tie is its).
    assert await a.try_acquire_fair(ENGINE, 2, "flood", 1000.0) is None
    assert await b.try_acquire_fair(ENGINE, 2, "quiet", 1000.0) is not None


async def test_background_work_takes_a_free_slot_only_while_no_tenant_waits_anywhere(
    replicas: Callable[[str], EngineLeases],
) -> None:
    a, b = replicas("replica-a"), replicas("replica-b")
    held = await a.try_acquire_fair(ENGINE, 1, "flood", 10.0)
    assert held is not None
    assert await b.try_acquire_fair(ENGINE, 1, "quiet", 10.0) is None  # quiet now waits
    await a.release(ENGINE, held)

    assert await a.try_acquire_fair(ENGINE, 1, "", 0.0) is None  # shadow work yields to the waiting tenant
    assert await b.try_acquire_fair(ENGINE, 1, "quiet", 10.0) is not None


async def test_an_idle_tenant_banks_no_credit(replicas: Callable[[str], EngineLeases]) -> None:
    a, b = replicas("replica-a"), replicas("replica-b")
    for _ in range(3):  # the flood is served alone for a while: its counter rises
        lease = await a.try_acquire_fair(ENGINE, 1, "flood", 100.0)
        assert lease is not None
        await a.release(ENGINE, lease)
    held = await a.try_acquire_fair(ENGINE, 1, "flood", 100.0)
    assert held is not None
    assert await a.try_acquire_fair(ENGINE, 1, "flood", 100.0) is None  # the flood waits for more
    assert await b.try_acquire_fair(ENGINE, 1, "quiet", 100.0) is None  # quiet arrives: lifted, not at 0
    await a.release(ENGINE, held)
    assert await b.try_acquire_fair(ENGINE, 1, "quiet", 100.0) is not None  # quiet first (it holds none) ...
    state = b._redis  # the counters as Redis holds them
    quiet_counter = await state.zscore(f"{PREFIX}:{ENGINE}:served", "quiet")
    flood_counter = await state.zscore(f"{PREFIX}:{ENGINE}:served", "flood")
    # ... but from the flood's level, not from zero (+ its own call): it cannot now take four in a row
    assert (quiet_counter, flood_counter) == (500.0, 400.0)
