"""The engine pool on fake engines: least-loaded choice, one shared queue, failover, down engines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import AsyncExitStack

import httpx
import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from gateway.engine.admission import AdmissionQueue
from gateway.engine.circuit import CircuitBreaker, CircuitOpen
from gateway.engine.client import EngineClient
from gateway.engine.pool import EnginePool, EngineSlot, HeldEngine
from gateway.engine.pool_build import register_pool_metrics
from gateway.errors import EngineUnavailable, Overloaded
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from tests.support import FakeClock

A, B = "http://engine-a.test", "http://engine-b.test"
ANSWER = {
    "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1},
}



def answering(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=ANSWER)


def refusing(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def engine_slot(
    url: str,
    cap: int,
    handler: Callable[[httpx.Request], httpx.Response] = answering,
    clock: FakeClock | None = None,
) -> EngineSlot:
    circuit = CircuitBreaker(url, consecutive_failures=1, cooldown_s=5, clock=clock or FakeClock())
    client = EngineClient(
        url,
        connect_timeout_s=1,
        first_token_timeout_s=5,
        total_timeout_s=5,
        connect_retries=0,
        max_connections=4,
        transport=httpx.MockTransport(handler),
        circuit=circuit,
    )
    return EngineSlot(client, cap, circuit)


def pool_of(*engines: EngineSlot, queue_size: int = 10, timeout_s: float = 5) -> EnginePool:
    return EnginePool(list(engines), AdmissionQueue(sum(e.cap for e in engines), queue_size, timeout_s))


async def hold(stack: AsyncExitStack, pool: EnginePool, count: int, priority: int = 0) -> list[HeldEngine]:
    return [await stack.enter_async_context(pool.slot(priority)) for _ in range(count)]


async def test_slots_go_to_the_least_loaded_engine_up_to_each_cap() -> None:
    pool = pool_of(engine_slot(A, 2), engine_slot(B, 3))
    async with AsyncExitStack() as stack:
        held = await hold(stack, pool, 5)
        assert [h.engine.url for h in held] == [A, B, B, A, B]  # by in-flight / cap, ties to the first listed
        assert [e.inflight for e in pool.engines] == [2, 3]
        with pytest.raises(Overloaded):
            async with pool.slot(timeout_s=0.05):
                pytest.fail("a sixth slot was granted beyond the caps 2 + 3")
    assert [e.inflight for e in pool.engines] == [0, 0]
    assert pool.queue.inflight == 0


async def test_a_waiter_gets_the_slot_an_engine_frees_by_priority() -> None:
    pool = pool_of(engine_slot(A, 1), engine_slot(B, 1))
    order: list[tuple[str, str]] = []

    async def wait(name: str, priority: int) -> None:
        async with pool.slot(priority) as held:
            order.append((name, held.engine.url))

    async with AsyncExitStack() as stack:
        first, _ = await hold(stack, pool, 2)
        waiters = [asyncio.create_task(wait("background", 5)), asyncio.create_task(wait("live", 0))]
        await asyncio.sleep(0)
        assert pool.queue.queued == 2
        assert first.engine.url == A
        await stack.aclose()  # both engines free a slot
    await asyncio.gather(*waiters)
    assert [name for name, _ in order] == ["live", "background"]


async def test_equally_loaded_engines_tie_to_the_one_with_fewer_recent_failures() -> None:
    pool = pool_of(engine_slot(A, 2), engine_slot(B, 2))
    pool.engines[0].record(True)
    async with pool.slot() as held:
        assert held.engine.url == B


async def test_a_call_the_engine_never_took_moves_to_another_engine() -> None:
    pool = pool_of(engine_slot(A, 2, refusing), engine_slot(B, 2))
    async with pool.slot() as held:
        assert held.engine.url == A
        answer = await held.chat({"model": "m", "messages": []}, "r1")
        assert held.engine.url == B
        assert [e.inflight for e in pool.engines] == [0, 1]
    assert answer.content == "ok"
    assert pool.engines[0].failovers == 1
    assert pool.engines[0].state == "open"  # one failure opens these test circuits


async def test_an_answer_the_engine_started_is_not_moved() -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "boom"}})

    calls: list[str] = []

    def counting(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return answering(request)

    pool = pool_of(engine_slot(A, 1, failing), engine_slot(B, 1, counting))
    async with pool.slot() as held:
        with pytest.raises(Exception, match="engine answered 500"):
            await held.chat({"model": "m", "messages": []}, "r1")
    assert calls == []


async def test_an_open_engine_takes_no_calls_until_its_cool_down_then_one_probe() -> None:
    clock = FakeClock()
    a = engine_slot(A, 2, clock=clock)
    pool = pool_of(a, engine_slot(B, 2))
    a.circuit.record_failure()
    assert a.state == "open"
    async with AsyncExitStack() as stack:
        held = await hold(stack, pool, 2)
        assert {h.engine.url for h in held} == {B}
        with pytest.raises(Overloaded):  # A's two slots are not counted while it is down
            async with pool.slot(timeout_s=0.05):
                pass
    clock.now += 5
    async with AsyncExitStack() as stack:
        held = await hold(stack, pool, 3)
        assert [h.engine.url for h in held] == [A, B, B]  # the probe first, then A has no more room
        with pytest.raises(Overloaded):
            async with pool.slot(timeout_s=0.05):
                pass


async def test_when_every_engine_is_down_a_request_is_refused_at_once_with_retry_after() -> None:
    pool = pool_of(engine_slot(A, 2), engine_slot(B, 2))
    for engine in pool.engines:
        engine.circuit.record_failure()
    with pytest.raises(CircuitOpen) as refused:
        async with pool.slot():
            pass
    assert refused.value.headers() == {"Retry-After": "5"}
    assert pool.queue.inflight == 0


async def test_waiters_are_refused_when_the_last_engine_goes_down() -> None:
    pool = pool_of(engine_slot(A, 1))
    async with AsyncExitStack() as stack:
        await hold(stack, pool, 1)
        waiter = asyncio.create_task(hold(stack, pool, 1))
        await asyncio.sleep(0)
        assert pool.queue.queued == 1
        pool.engines[0].circuit.record_failure()
        pool.refresh()
        with pytest.raises(CircuitOpen):
            await waiter
    assert pool.queue.inflight == 0


async def test_a_spare_slot_is_given_only_when_nobody_waits() -> None:
    pool = pool_of(engine_slot(A, 1), engine_slot(B, 1))
    async with pool.spare_slot() as spare:
        assert spare is not None
        async with pool.slot() as live:
            assert live.engine is not spare.engine
            async with pool.spare_slot() as none_left:
                assert none_left is None
    assert pool.queue.inflight == 0


async def test_per_engine_gauges_are_labelled_by_engine() -> None:
    pool = pool_of(engine_slot(A, 2), engine_slot(B, 3))
    pool.engines[1].circuit.record_failure()
    metrics = GatewayMetrics()
    register_pool_metrics(pool, metrics)
    registry = metrics.registry
    async with pool.slot():
        text = generate_latest(registry).decode()
    assert f'modgate_engine_slot_inflight{{engine="{A}"}} 1.0' in text
    assert f'modgate_engine_slot_cap{{engine="{B}"}} 3.0' in text
    assert f'modgate_engine_up{{engine="{A}"}} 1.0' in text
    assert f'modgate_engine_up{{engine="{B}"}} 0.0' in text


async def test_an_engine_reads_down_from_its_failure_until_a_probe_succeeds_cool_down_or_not() -> None:
    clock = FakeClock()
    pool = pool_of(engine_slot(A, 2), engine_slot(B, 2, clock=clock))
    metrics = GatewayMetrics()
    register_pool_metrics(pool, metrics)
    registry = metrics.registry

    def up_of_b() -> str:
        line = next(line for line in generate_latest(registry).decode().splitlines()
                    if line.startswith(f'modgate_engine_up{{engine="{B}"}}'))
        return line.rsplit(" ", 1)[1]

    pool.engines[1].circuit.record_failure()
    assert up_of_b() == "0.0"
    clock.advance(60)  # long past the cool-down: half-open, but nothing has shown the engine answers
    assert pool.engines[1].state == "half_open"
    assert up_of_b() == "0.0"
    probe = pool.engines[1].circuit.before_call()
    pool.engines[1].circuit.record_success(probe)
    assert up_of_b() == "1.0"


def test_engine_urls_and_caps_are_read_from_comma_separated_settings() -> None:
    settings = Settings(engine={"url": f" {A}/, {B} ", "caps": f"{A}=2, {B}/=4", "max_inflight": 8})
    assert settings.engine_urls() == [A, B]
    assert [settings.engine_cap(url) for url in settings.engine_urls()] == [2, 4]
    assert Settings(engine={"url": B}).engine_urls() == [B]
    assert Settings(engine={"url": B}).engine_cap(B) == 8  # no caps: MODGATE_ENGINE__MAX_INFLIGHT


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"engine": {"url": f"{A},{A}"}}, "twice"),
        ({"engine": {"url": f"{A},ftp://x"}}, "http://"),
        ({"engine": {"url": A, "caps": f"{A}=zero"}}, "must look like"),
        ({"engine": {"url": A, "caps": f"{A}=0"}}, "must look like"),
        ({"engine": {"url": A, "caps": f"{B}=2"}}, "MODGATE_ENGINE__URL lacks"),
        ({"leases": {"ttl_s": 3, "renew_every_s": 3}}, "shorter than"),
    ],
)
def test_malformed_engine_settings_fail_with_a_readable_message(
    changes: dict[str, object], complaint: str
) -> None:
    with pytest.raises(ValidationError, match=complaint):
        Settings(**changes)  # type: ignore[arg-type]  # malformed on purpose


async def test_readiness_reports_each_engine_and_only_a_healthy_closed_one_is_up() -> None:
    pool = pool_of(engine_slot(A, 2), engine_slot(B, 3, refusing))
    report = json.loads(json.dumps(await pool.readiness()))  # what /readyz embeds must serialise
    assert report == [
        {"url": A, "up": True, "health": True, "circuit": "closed", "inflight": 0, "cap": 2,
         "kind": "unknown"},
        {"url": B, "up": False, "health": False, "circuit": "closed", "inflight": 0, "cap": 3,
         "kind": "unknown"},
    ]
    pool.engines[0].circuit.record_failure()
    assert [engine["up"] for engine in await pool.readiness()] == [False, False]


async def test_calls_without_a_slot_are_answered_by_the_first_engine_that_can() -> None:
    def models(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"count": 7})
        return httpx.Response(200, json={"data": [{"id": "served-model"}]})

    pool = pool_of(engine_slot(A, 2, refusing), engine_slot(B, 2, models))
    assert await pool.model_ids() == ["served-model"]  # A is dead but its circuit has not opened yet
    assert await pool.tokenize({"prompt": "x"}) == 7
    dead = pool_of(engine_slot(A, 2, refusing))
    with pytest.raises(EngineUnavailable):
        await dead.model_ids()
