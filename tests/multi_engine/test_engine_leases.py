"""Engine slots shared by replicas in a real Redis: the cap across replicas, expiry, renewal, fallback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.engine.admission import AdmissionQueue
from gateway.engine.circuit import CircuitBreaker
from gateway.engine.client import EngineClient
from gateway.engine.fairness import Work
from gateway.engine.leases import LEASE_STORE_DOWN, EngineLeases, LeaseRider
from gateway.engine.pool import EnginePool, EngineSlot, SlotWithheld
from gateway.engine.pool_build import pool_reading
from gateway.errors import Overloaded
from gateway.http.services import redis_client
from gateway.series.scraped import pool_series
from tests.processes import poll_async

ENGINE = "http://engine-a.test"
PREFIX = "test:engine-leases"


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[Callable[..., EngineLeases]]:
    """``replicas(ttl_s=..., renew_every_s=...)``: lease holders on the test Redis (each on a client of its
    own, as replicas are), closed afterwards."""
    made: list[tuple[EngineLeases, aioredis.Redis]] = []

    def make(ttl_s: float = 10.0, renew_every_s: float = 3.0) -> EngineLeases:
        client = redis_client(redis_url)
        leases = EngineLeases(client, key_prefix=PREFIX, ttl_s=ttl_s, renew_every_s=renew_every_s)
        made.append((leases, client))
        return leases

    yield make
    for leases, client in made:
        await leases.aclose()
        await client.aclose()


def pool_with(leases: EngineLeases | None, cap: int = 2) -> EnginePool:
    client = EngineClient(
        ENGINE,
        connect_timeout_s=1,
        first_token_timeout_s=5,
        total_timeout_s=5,
        connect_retries=0,
        max_connections=4,
        transport=httpx.MockTransport(lambda request: httpx.Response(200)),
    )
    engine = EngineSlot(client, cap, CircuitBreaker(ENGINE))
    return EnginePool([engine], AdmissionQueue(cap, 10, 5.0), leases)


async def test_no_more_leases_than_the_cap_are_granted_across_replicas(
    replicas: Callable[..., EngineLeases],
) -> None:
    one, two = replicas(), replicas()
    granted = [await holder.try_acquire(ENGINE, 3) for holder in (one, two, one)]
    assert all(granted)
    assert await two.try_acquire(ENGINE, 3) is None
    assert await one.try_acquire(ENGINE, 3) is None
    assert await one.count(ENGINE) == 3
    assert (one.held(ENGINE), two.held(ENGINE)) == (2, 1)


async def test_concurrent_acquires_never_pass_the_cap(redis_url: str) -> None:
    # Four replicas, each client with the ten connections a busy replica keeps open, so the race is the
    # scripts' alone. Cold, each acquire's 0.5 s deadline also paid for a TCP connect, and forty connects at
    # once in a process niced under load overran it (a redis TimeoutError in sock_connect, not a cap broken).
    clients = [redis_client(redis_url) for _ in range(4)]
    holders = [EngineLeases(client, key_prefix=PREFIX) for client in clients]
    try:
        await asyncio.gather(*(client.ping() for client in clients for _ in range(10)))
        granted = await asyncio.gather(*(h.try_acquire(ENGINE, 5) for h in holders for _ in range(10)))
    finally:
        for holder, client in zip(holders, clients, strict=True):
            await holder.aclose()
            await client.aclose()
    assert sum(1 for lease in granted if lease) == 5


async def test_a_released_lease_frees_its_slot_for_another_replica(
    replicas: Callable[..., EngineLeases],
) -> None:
    one, two = replicas(), replicas()
    lease = await one.try_acquire(ENGINE, 1)
    assert lease is not None
    assert await two.try_acquire(ENGINE, 1) is None
    await one.release(ENGINE, lease)
    assert await two.try_acquire(ENGINE, 1) is not None


async def test_a_lease_nobody_renews_expires_and_frees_its_slot(
    replicas: Callable[..., EngineLeases],
) -> None:
    crashed, survivor = replicas(ttl_s=0.3, renew_every_s=0.1), replicas()
    assert await crashed.try_acquire(ENGINE, 1) is not None  # never renewed: its renewer was never started
    assert await survivor.try_acquire(ENGINE, 1) is None
    await poll_async(lambda: survivor.try_acquire(ENGINE, 1), 5, "the unrenewed lease to expire")


async def test_renewal_pushes_the_expiry_ahead(replicas: Callable[..., EngineLeases], redis_url: str) -> None:
    leases = replicas(ttl_s=5.0, renew_every_s=1.0)
    lease = await leases.try_acquire(ENGINE, 1)
    assert lease is not None
    redis = aioredis.Redis.from_url(redis_url)
    try:
        seconds, micros = await redis.time()
        almost_lapsed = seconds * 1000 + micros // 1000 + 200  # the score is the expiry, in Redis epoch ms
        await redis.zadd(leases.key(ENGINE), {lease: almost_lapsed})
        await leases.renew()
        renewed = await redis.zscore(leases.key(ENGINE), lease)
    finally:
        await redis.aclose()
    assert renewed is not None
    assert renewed >= almost_lapsed + 4000  # about ttl_s from now again
    assert leases.lost == 0


async def test_a_lease_that_lapsed_is_not_renewed_back(replicas: Callable[..., EngineLeases]) -> None:
    stalled, other = replicas(ttl_s=0.3, renew_every_s=0.1), replicas()
    assert await stalled.try_acquire(ENGINE, 1) is not None
    await poll_async(lambda: other.try_acquire(ENGINE, 1), 5, "the stalled replica's lease to lapse")
    await stalled.renew()
    assert stalled.lost == 1
    assert stalled.held(ENGINE) == 0
    assert await stalled.count(ENGINE) == 1  # only the other replica's


async def test_a_lost_lease_counts_outside_the_shared_cap_until_its_call_gives_it_back(
    replicas: Callable[..., EngineLeases],
) -> None:
    """A lease gone from Redis while its call runs (lapsed, or never replicated before a failover): the call
    runs on outside the shared cap, and the pool's gauge says so until it ends."""
    leases = replicas(ttl_s=0.3, renew_every_s=0.1)
    pool = pool_with(leases)
    try:
        async with pool.slot() as held:
            await leases._redis.zrem(leases.key(ENGINE), held.lease)  # gone from Redis, the call runs on
            await leases.renew()
            assert leases.lost == 1
            assert leases.running_unleased == {held.lease}
        assert leases.running_unleased == set()
    finally:
        await pool.aclose()


async def test_a_lease_given_back_while_its_renewal_was_on_its_way_is_not_lost(
    replicas: Callable[..., EngineLeases],
) -> None:
    leases = replicas()
    lease = await leases.try_acquire(ENGINE, 2)
    assert lease is not None
    renew_script = leases._renew

    async def released_meanwhile(**arguments: Any) -> Any:
        await leases.release(ENGINE, lease)  # after the renewal took its list, before Redis runs it
        return await renew_script(**arguments)

    leases._renew = released_meanwhile  # type: ignore[assignment]  # a script stand-in that releases first
    await leases.renew()  # Redis reports the lease gone: it was given back, not lost
    assert leases.lost == 0
    assert leases.running_unleased == set()


async def test_a_pool_waits_for_a_slot_another_replica_gives_back(
    replicas: Callable[..., EngineLeases],
) -> None:
    first, second = pool_with(replicas()), pool_with(replicas())
    async with AsyncExitStack() as stack:
        held = [await stack.enter_async_context(first.slot()) for _ in range(2)]
        with pytest.raises(Overloaded):  # its own local slots are free, the engine's shared ones are not
            async with second.slot(timeout_s=0.2):
                pass

        async def take() -> str:
            async with second.slot() as slot:
                return slot.lease

        waiting = asyncio.create_task(take())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await stack.aclose()
        assert held[0].lease  # a Redis lease, not a local-only slot
    assert await waiting
    assert second.engines[0].inflight == 0


async def test_with_redis_unreachable_a_pool_serves_on_its_local_cap_and_says_so() -> None:
    client = redis_client("redis://127.0.0.1:1/0")
    unreachable = EngineLeases(client, key_prefix=PREFIX, timeout_s=0.2)
    pool = pool_with(unreachable, cap=2)
    try:
        async with AsyncExitStack() as stack:
            held = [await stack.enter_async_context(pool.slot()) for _ in range(2)]
            assert [slot.lease for slot in held] == ["", ""]  # local-only slots
            assert pool.leases_local_only
            with pytest.raises(Overloaded):  # the local cap still holds
                async with pool.slot(timeout_s=0.05):
                    pass
    finally:
        await pool.aclose()
        await client.aclose()
    assert pool.engines[0].inflight == 0


async def test_calls_admitted_on_local_caps_are_adopted_as_leases_before_a_new_one_is_taken(
    replicas: Callable[..., EngineLeases],
) -> None:
    """After a failover the shared cap must see the calls admitted on local caps meanwhile: they are adopted
    as leases before the next lease is asked, so the gauge falls to 0 and Redis counts both calls."""
    dead = redis_client("redis://127.0.0.1:1/0")
    pool = pool_with(EngineLeases(dead, key_prefix=PREFIX, timeout_s=0.2))
    pool.lease_retry_after_failure_s = 0.0  # ask Redis again at the next call

    def gauge() -> float:
        name = "modgate_engine_calls_outside_shared_cap"
        (family,) = [family for family in pool_series(pool_reading(pool)) if family.name == name]
        return float(family.samples[0].value)

    try:
        async with pool.slot() as local:
            assert local.lease == ""
            assert (pool.calls_on_local_caps, gauge()) == (1, 1.0)
            pool.leases = leases = replicas()  # Redis answers again: a promoted primary
            async with pool.slot() as shared:
                assert shared.lease  # a lease in Redis
                assert not pool.leases_local_only
                assert gauge() == 0.0  # the local call was adopted as a lease first
                assert await leases.count(ENGINE) == 2
            assert await leases.count(ENGINE) == 1
        assert await leases.count(ENGINE) == 0  # the adopted lease went back with its call
        assert gauge() == 0.0
    finally:
        await pool.aclose()
        await dead.aclose()


async def test_a_local_call_that_ends_while_it_is_being_adopted_leaves_no_lease_behind(
    replicas: Callable[..., EngineLeases],
) -> None:
    dead = redis_client("redis://127.0.0.1:1/0")
    pool = pool_with(EngineLeases(dead, key_prefix=PREFIX, timeout_s=0.2), cap=3)
    pool.lease_retry_after_failure_s = 0.0
    try:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(pool.slot())  # a local call that runs on
            ending = pool.slot()
            await ending.__aenter__()  # and one that ends while Redis adopts them
            pool.leases = leases = replicas()
            adopt = leases.adopt

            async def one_ends_meanwhile(engine: str, count: int) -> list[str]:
                members = await adopt(engine, count)
                await ending.__aexit__(None, None, None)
                return members

            leases.adopt = one_ends_meanwhile  # type: ignore[method-assign]  # a Redis where a call ends mid-adoption
            async with pool.slot() as shared:
                assert shared.lease
                assert await leases.count(ENGINE) == 2  # the call running on, adopted, and this one
        assert await leases.count(ENGINE) == 0
        assert leases.held(ENGINE) == 0  # nothing left to renew
        assert pool.calls_on_local_caps == 0
    finally:
        await pool.aclose()
        await dead.aclose()


async def test_a_replica_with_no_engine_call_notices_that_redis_answers_again(
    replicas: Callable[..., EngineLeases],
) -> None:
    """A replica whose answers all come from reused verdicts (or that is idle) asks Redis no lease; it must
    not go on saying it holds the caps alone (the alert's gauge) once Redis, or a promoted replica, is
    back."""
    dead = redis_client("redis://127.0.0.1:1/0")
    pool = pool_with(EngineLeases(dead, key_prefix=PREFIX, timeout_s=0.2))
    pool.lease_retry_after_failure_s = 0.1
    pool.refresh_every_s = 0.05
    pool.start()
    try:
        async with pool.slot():
            pass
        assert pool.leases_local_only
        await asyncio.sleep(0.3)
        assert pool.leases_local_only  # still unreachable: the probes fail too
        pool.leases = replicas()  # Redis answers again; no call comes
        await poll_async(lambda: not pool.leases_local_only, 5, "the flag to fall without a call")
    finally:
        await pool.aclose()
        await dead.aclose()


async def test_a_grant_after_a_timeout_ends_the_local_caps_for_every_call(
    replicas: Callable[..., EngineLeases],
) -> None:
    """Two calls wait on Redis at once; one times out (local caps), then the other comes back granted: Redis
    answers, so the next call asks it again instead of taking a local slot while the gauge reads 0."""
    leases = replicas()
    pool = pool_with(leases, cap=4)
    pool.fair_leases = False
    acquire, asked = leases.try_acquire, asyncio.Event()
    timed_out = asyncio.Event()

    async def one_times_out(
        engine: str, cap: int, rider: LeaseRider | None = None, *, follows_slots: bool = False
    ) -> str | None:
        if not asked.is_set():  # the first call: waits until the second is on its way too, then fails
            asked.set()
            await asyncio.sleep(0.05)
            timed_out.set()
            raise TimeoutError("Redis did not answer within 0.5 s")
        await timed_out.wait()  # the second: its answer comes after the first one's failure
        return await acquire(engine, cap, rider, follows_slots=follows_slots)

    leases.try_acquire = one_times_out  # type: ignore[method-assign]  # a Redis that times out once
    try:
        async with AsyncExitStack() as stack:
            held = await asyncio.gather(*(stack.enter_async_context(pool.slot()) for _ in range(2)))
            assert sorted(bool(slot.lease) for slot in held) == [False, True]
            assert not pool.leases_local_only
            next_call = await stack.enter_async_context(pool.slot())
            assert next_call.lease  # asked Redis: a shared slot, not a local one
    finally:
        await pool.aclose()


# Riders: a caller's Lua in the same script as the lease call. This one finds the key its first argument
# names (a value withholds the slot) and writes what it is given after the lease's own arguments.
FIND = "local found = redis.call('GET', KEYS[K + 1])\nif found then return found end\nreturn false"
NOTE = "redis.call('SET', KEYS[K + 1], ARGV[A + 1])\nreturn false"


async def test_a_rider_that_finds_nothing_lets_the_acquire_run(
    replicas: Callable[..., EngineLeases],
) -> None:
    leases = replicas()
    rider = LeaseRider(FIND, ["test:found"], [], leases._redis)
    assert await leases.try_acquire_fair(ENGINE, 1, "tenant", 1.0, rider) is not None
    assert (rider.ran, rider.withheld, rider.result) == (True, False, None)
    assert await leases.count(ENGINE) == 1


async def test_a_rider_that_finds_something_withholds_the_slot_and_touches_no_lease_key(
    replicas: Callable[..., EngineLeases], redis_url: str
) -> None:
    leases = replicas()
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.set("test:found", "a verdict")
        acquires: list[Callable[[LeaseRider], Awaitable[str | None]]] = [
            lambda r: leases.try_acquire(ENGINE, 1, r),
            lambda r: leases.try_acquire_fair(ENGINE, 1, "tenant", 1.0, r),
        ]
        for acquire in acquires:
            rider = LeaseRider(FIND, ["test:found"], [], leases._redis)
            assert await acquire(rider) is None
            assert rider.withheld
            assert rider.result == b"a verdict"
        assert [key async for key in client.scan_iter(f"{PREFIX}:*")] == []  # not even a waiting tenant
    finally:
        await client.aclose()
    assert leases.held(ENGINE) == 0


async def test_a_release_rider_runs_with_the_release(
    replicas: Callable[..., EngineLeases], redis_url: str
) -> None:
    leases = replicas()
    lease = await leases.try_acquire(ENGINE, 1)
    assert lease is not None
    rider = LeaseRider(NOTE, ["test:noted"], ["kept"], leases._redis)
    await leases.release(ENGINE, lease, rider)
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.get("test:noted") == b"kept"
    finally:
        await client.aclose()
    assert rider.ran
    assert rider.error is None
    assert await leases.count(ENGINE) == 0


async def test_a_rider_for_another_redis_client_is_left_to_its_owner(
    replicas: Callable[..., EngineLeases], redis_url: str
) -> None:
    leases = replicas()
    other = aioredis.Redis.from_url(redis_url)
    try:
        rider = LeaseRider(FIND, ["test:found"], [], other)
        lease = await leases.try_acquire(ENGINE, 1, rider)
        assert lease is not None
        await leases.release(ENGINE, lease, LeaseRider(NOTE, ["test:noted"], ["kept"], other))
        assert await other.get("test:noted") is None
    finally:
        await other.aclose()
    assert not rider.ran


async def test_with_redis_unreachable_a_rider_carries_the_error() -> None:
    client = redis_client("redis://127.0.0.1:1/0")
    unreachable = EngineLeases(client, key_prefix=PREFIX, timeout_s=0.2)
    rider = LeaseRider(FIND, ["test:found"], [], client)
    try:
        with pytest.raises(LEASE_STORE_DOWN):
            await unreachable.try_acquire(ENGINE, 1, rider)
    finally:
        await client.aclose()
    assert rider.ran
    assert rider.error is not None
    assert not rider.withheld


async def test_a_withheld_slot_leaves_the_pool_and_its_fair_share_as_they_were(
    replicas: Callable[..., EngineLeases], redis_url: str
) -> None:
    leases = replicas()
    pool = pool_with(leases)
    queue = pool.queue
    async with pool.slot(work=Work("quiet", 10.0)):  # another tenant served, so the floor has moved
        pass
    before = (queue.figures(), dict(queue.share.counters), dict(queue.share.served), queue.share.snapshot(""))
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.set("test:found", "a verdict")
        rider = LeaseRider(FIND, ["test:found"], [], leases._redis)
        with pytest.raises(SlotWithheld):
            async with pool.slot(work=Work("tenant", 50.0), rider=rider):
                raise AssertionError("a withheld slot is never held")
    finally:
        await client.aclose()
    assert (queue.figures(), dict(queue.share.counters), dict(queue.share.served),
            queue.share.snapshot("")) == before
    assert (queue.inflight, pool.engines[0].inflight, leases.held(ENGINE)) == (0, 0, 0)


async def test_a_rider_is_not_sent_when_the_call_would_wait(replicas: Callable[..., EngineLeases]) -> None:
    leases = replicas()
    pool = pool_with(leases, cap=1)
    rider = LeaseRider(FIND, ["test:found"], [], leases._redis)
    async with pool.slot():
        with pytest.raises(SlotWithheld):  # the one slot is taken: asking would mean waiting
            async with pool.slot(rider=rider):
                raise AssertionError("a withheld slot is never held")
    assert not rider.ran
    assert pool.queue.inflight == 0
