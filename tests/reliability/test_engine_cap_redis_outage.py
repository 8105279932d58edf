"""The engine's cap across two replicas while their Redis is killed and when it comes back (private
redis-servers): each replica serves on its share of the cap meanwhile, and adopts its running calls as leases
before it takes a new one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import httpx
import pytest

from gateway.engine.admission import AdmissionQueue
from gateway.engine.circuit import CircuitBreaker
from gateway.engine.client import EngineClient
from gateway.engine.engine_slot import EngineSlot
from gateway.engine.leases import LEASE_STORE_DOWN, EngineLeases
from gateway.engine.pool import EnginePool
from gateway.errors import Overloaded
from gateway.http.services import redis_client
from tests.processes import RedisServer, poll_async

ENGINE = "http://engine-a.test"
CAP = 4


@dataclass
class FakeEngine:
    """What the engine would see: the calls holding a slot of it now, from any replica, and the most."""

    inflight: int = 0
    peak: int = 0
    served: int = 0

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            yield
        finally:
            self.inflight -= 1
            self.served += 1


@pytest.fixture
async def replicas(own_redis: RedisServer) -> AsyncIterator[list[EnginePool]]:
    """Two replicas' pools on one engine of cap 4, their leases in ``own_redis``, heartbeats running."""
    async with AsyncExitStack() as stack:
        pools = []
        for _ in range(2):
            client = redis_client(own_redis.url)
            stack.push_async_callback(client.aclose)
            leases = EngineLeases(client, key_prefix="test:outage", timeout_s=0.2)
            leases.stale_s = 0.3  # a replica silent this long may be on local caps
            engine = EngineClient(
                ENGINE, connect_timeout_s=1, first_token_timeout_s=5, total_timeout_s=5, connect_retries=0,
                max_connections=4, transport=httpx.MockTransport(lambda request: httpx.Response(200)),
            )
            pool = EnginePool([EngineSlot(engine, CAP, CircuitBreaker(ENGINE))], AdmissionQueue(CAP, 32, 5.0),
                              leases, lease_retry_after_failure_s=0.2, refresh_every_s=0.05)
            pool.start()
            stack.push_async_callback(pool.aclose)
            pools.append(pool)
        await poll_async(lambda: all(p.leases and p.leases.replicas_seen == 2 for p in pools), 5,
                         "both replicas in the registry")
        yield pools


async def load(pool: EnginePool, engine: FakeEngine, until: float) -> int:
    """Calls one after another on ``pool`` until ``until``, each 20 ms at the engine; those served."""
    served = 0
    while time.monotonic() < until:
        try:
            async with pool.slot(timeout_s=0.3), engine.call():
                await asyncio.sleep(0.02)
            served += 1
        except Overloaded:
            await asyncio.sleep(0.01)
    return served


async def test_two_replicas_never_put_more_than_the_cap_on_the_engine_while_redis_is_dead(
    replicas: list[EnginePool], own_redis: RedisServer,
) -> None:
    engine = FakeEngine()
    callers = [load(pool, engine, time.monotonic() + 3.0) for pool in replicas for _ in range(6)]
    running = asyncio.gather(*callers)
    await asyncio.sleep(0.5)
    shared = engine.served
    own_redis.kill()
    await poll_async(lambda: all(p.leases_local_only for p in replicas), 5, "both replicas on local caps")
    during = engine.served
    await running

    assert shared > 0  # calls went on with Redis
    assert engine.served > during  # and without it
    assert engine.peak <= CAP  # each replica on its share (4 / 2 replicas seen), never 4 each
    assert [p.engines[0].slot_cap() for p in replicas] == [2, 2]


async def test_running_calls_are_adopted_as_leases_before_a_new_one_is_taken(
    replicas: list[EnginePool], own_redis: RedisServer,
) -> None:
    first, second = replicas
    own_redis.kill()
    async with AsyncExitStack() as stack:
        local = [await stack.enter_async_context(first.slot(timeout_s=3)) for _ in range(2)]
        assert [held.lease for held in local] == ["", ""]  # its share of the cap, taken without Redis
        own_redis.start()  # back, empty: no lease of the calls running
        newer = await stack.enter_async_context(first.slot(timeout_s=3))
        assert newer.lease  # asked of Redis, after the running calls were adopted
        assert first.calls_on_local_caps == 0
        assert first.leases is not None
        assert await first.leases.count(ENGINE) == 3
        await stack.enter_async_context(second.slot(timeout_s=3))  # the fourth slot
        with pytest.raises(Overloaded):  # the engine has 4: the other replica gets no fifth
            async with second.slot(timeout_s=0.5):
                pass


async def test_a_heartbeat_that_reaches_a_stalled_redis_late_is_not_recorded(own_redis: RedisServer) -> None:
    """A replica whose heartbeat timed out on a stalled Redis serves on local caps soon after: that heartbeat,
    run when Redis wakes, must not make it look present to the others (they would not hold its share)."""
    client = redis_client(own_redis.url)
    leases = EngineLeases(client, key_prefix="test:stall", timeout_s=0.2)
    try:
        await leases.beat()
        first = await client.zscore(leases.registry_key, leases.replica)
        assert own_redis.process is not None
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(LEASE_STORE_DOWN):
                await leases.beat()
            await asyncio.sleep(0.8)  # past twice its deadline
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)
        await asyncio.sleep(0.2)  # Redis runs what waited in its socket
        assert await client.zscore(leases.registry_key, leases.replica) == first
    finally:
        await leases.aclose()
        await client.aclose()


async def test_a_replica_gone_quiet_still_counts_among_those_seen_for_a_while(own_redis: RedisServer) -> None:
    """Killed and restarted under a new name, a replica is counted twice for a while: shares get smaller,
    never larger (counted too soon as gone, the survivor took the whole cap while Redis was killed)."""
    clients = [redis_client(own_redis.url) for _ in range(2)]
    survivor, killed = (EngineLeases(c, key_prefix="test:gone", ttl_s=0.3, renew_every_s=0.1)
                        for c in clients)
    try:
        await killed.beat()
        await asyncio.sleep(0.5)  # past its ttl: its share is no longer held back, but it is still counted
        assert await survivor.beat() == 2
    finally:
        for leases, client in zip((survivor, killed), clients, strict=True):
            await leases.aclose()
            await client.aclose()
