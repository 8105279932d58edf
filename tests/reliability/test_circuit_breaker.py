"""The engine's circuit breaker: closed → open → half-open → closed, and a 503 with Retry-After while open."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from litestar.testing import AsyncTestClient

from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from gateway.engine.circuit import CircuitBreaker, CircuitOpen
from gateway.errors import UpstreamError
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.processes import poll
from tests.reliability.conftest import error_body
from tests.support import FakeClock, GatewayFactory, SimFactory, image_input


def failing(exc: BaseException) -> bool:
    return isinstance(exc, UpstreamError)


async def fail_once(breaker: CircuitBreaker) -> None:
    with pytest.raises(UpstreamError):
        async with breaker.call(failing):
            raise UpstreamError("engine answered 500")


async def succeed_once(breaker: CircuitBreaker) -> None:
    async with breaker.call(failing):
        pass


async def test_consecutive_failures_open_the_circuit() -> None:
    breaker = CircuitBreaker("engine", consecutive_failures=3, cooldown_s=10, clock=FakeClock())
    for _ in range(2):
        await fail_once(breaker)
    assert breaker.state == "closed"
    await fail_once(breaker)
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen) as refused:
        async with breaker.call(failing):
            pytest.fail("an open circuit let a call through")
    assert refused.value.status == 503
    assert refused.value.headers() == {"Retry-After": "10"}


async def test_a_success_resets_the_consecutive_count() -> None:
    breaker = CircuitBreaker("engine", consecutive_failures=3, failure_rate=1.0, clock=FakeClock())
    for _ in range(5):
        await fail_once(breaker)
        await fail_once(breaker)
        await succeed_once(breaker)
    assert breaker.state == "closed"


async def test_a_failure_rate_over_the_window_opens_the_circuit() -> None:
    breaker = CircuitBreaker(
        "engine", consecutive_failures=100, failure_rate=0.5, window=10, min_calls=10, clock=FakeClock()
    )
    for _ in range(4):
        await succeed_once(breaker)
        await fail_once(breaker)
    assert breaker.state == "closed"  # 4 of 8: not yet min_calls
    await succeed_once(breaker)
    await fail_once(breaker)  # 5 of 10 failed
    assert breaker.state == "open"


async def test_after_the_cool_down_one_probe_goes_through_and_its_success_closes_the_circuit() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("engine", consecutive_failures=1, cooldown_s=5, clock=clock)
    await fail_once(breaker)
    clock.now += 2
    assert breaker.retry_after_s() == 3
    clock.now += 3
    assert breaker.state == "half_open"
    probe_started, release_probe = asyncio.Event(), asyncio.Event()

    async def probe() -> None:
        async with breaker.call(failing):
            probe_started.set()
            await release_probe.wait()

    task = asyncio.create_task(probe())
    await probe_started.wait()
    with pytest.raises(CircuitOpen):  # only one probe at a time
        async with breaker.call(failing):
            pass
    release_probe.set()
    await task
    assert breaker.state == "closed"
    await succeed_once(breaker)


async def test_a_failed_probe_opens_the_circuit_for_a_fresh_cool_down() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("engine", consecutive_failures=1, cooldown_s=5, clock=clock)
    await fail_once(breaker)
    clock.now += 5
    await fail_once(breaker)  # the probe
    assert breaker.state == "open"
    assert breaker.retry_after_s() == 5
    assert breaker.times_opened == 2


async def test_a_cancelled_probe_lets_the_next_caller_probe() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("engine", consecutive_failures=1, cooldown_s=5, clock=clock)
    await fail_once(breaker)
    clock.now += 5
    with pytest.raises(asyncio.CancelledError):
        async with breaker.call(failing):
            raise asyncio.CancelledError
    await succeed_once(breaker)
    assert breaker.state == "closed"


async def test_errors_that_are_not_engine_failures_do_not_count() -> None:
    breaker = CircuitBreaker("engine", consecutive_failures=1, clock=FakeClock())
    for _ in range(3):
        with pytest.raises(ValueError, match="ours"):
            async with breaker.call(failing):
                raise ValueError("ours")
    assert breaker.state == "closed"


async def test_a_failing_engine_gets_503_with_retry_after_instead_of_more_calls() -> None:
    calls: list[str] = []

    def engine(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(500, json={"error": {"message": "boom"}})

    settings = Settings(engine={"model": "m"}, circuit={"consecutive_failures": 3, "cooldown_s": 30})
    app = create_app(settings, engine_transport=httpx.MockTransport(engine))
    body = {"input": image_input(make_keyframe("allow", 320, 180))}
    async with AsyncTestClient(app) as client:
        first = [await client.post("/v1/moderations", json=body) for _ in range(3)]
        refused = await client.post("/v1/moderations", json=body)
    assert [r.status_code for r in first] == [502, 502, 502]
    assert refused.status_code == 503
    assert error_body(refused)["code"] == "circuit_open"
    assert 1 <= int(refused.headers["Retry-After"]) <= 30
    assert calls.count("/v1/chat/completions") == 3  # the fourth never reached the engine


def test_the_circuit_closes_again_once_the_engine_recovers(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim(faults=Faults(error_rate=1.0))
    gateway = start_gateway(engine={"url": sim.url}, circuit={"consecutive_failures": 2, "cooldown_s": 0.5})
    body = {"input": image_input(make_keyframe("allow", 320, 180))}
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        statuses = [client.post("/v1/moderations", json=body).status_code for _ in range(3)]
        assert statuses == [502, 502, 503]
        assert client.post(f"{sim.url}/sim/faults", json={}).status_code == 200  # the engine is well again
        recovered = poll(
            lambda: client.post("/v1/moderations", json=body).status_code == 200,
            20,
            "the circuit to let a probe through and close",
        )
    assert recovered
