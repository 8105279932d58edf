"""An engine that says it is busy is not broken: its busy answers are back-pressure, never circuit failures.

The bodies are the engines' own: vLLM's ``QueueOverflowError`` past ``--max-num-queued-reqs`` and
``MaxQueuedTokensError`` past ``--max-num-queued-tokens`` (vllm/exceptions.py, rendered by
entrypoints/serve/exception_handling/error_response.py with the status's phrase as the type), and
llama-server's ``ERROR_TYPE_UNAVAILABLE`` "no slot available" (tools/server, type ``unavailable_error``).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deploy.keyframes import make_keyframe
from gateway.engine.pool_build import register_pool_metrics
from gateway.http.app import create_app
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from tests.multi_engine.test_engine_pool import A, B, engine_slot, pool_of
from tests.reliability.conftest import error_body
from tests.reliability.test_engine_faults import ANSWER
from tests.support import image_input

BODY = {"input": image_input(make_keyframe("allow", 320, 180))}

VLLM_QUEUE_FULL = {
    "error": {
        "message": "The engine is currently busy and cannot accept new requests. "
        "Please try again later or on a different instance.",
        "type": "Service Unavailable",
        "param": None,
        "code": 503,
    }
}
VLLM_PREFILL_BACKLOG = {
    "error": {
        "message": "The engine has reached its prefill token backlog limit. "
        "Please try again later or on a different instance.",
        "type": "Service Unavailable",
        "param": None,
        "code": 503,
    }
}
LLAMACPP_NO_SLOT = {"error": {"code": 503, "message": "no slot available", "type": "unavailable_error"}}
VERDICT = {}  # the success: ANSWER's stream


class Engines:
    """An engine (``a``) whose chat calls are answered by the next of its script (the last one repeats)."""

    def __init__(self, **scripts: list[tuple[int, dict[str, Any]]]) -> None:
        self.scripts = scripts
        self.calls: dict[str, int] = dict.fromkeys(scripts, 0)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = "a"
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "not here"}})
        script = self.scripts[host]
        status, body = script[min(self.calls[host], len(script) - 1)]
        self.calls[host] += 1
        if status == 200:
            return httpx.Response(200, content=ANSWER, headers={"content-type": "text/event-stream"})
        return httpx.Response(status, json=body)


def busy_counts(exposition: str) -> dict[str, float]:
    """``modgate_engine_busy_total`` by engine."""
    return {
        sample.labels["engine"]: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "modgate_engine_busy_total"
    }


def settings(**extra: Any) -> Settings:
    return Settings.model_validate(
        {
            "engine": {"model": "m", "kind": "vllm"},
            "circuit": {"consecutive_failures": 2, "cooldown_s": 30},
            **extra,
        }
    )


@pytest.mark.parametrize(
    "busy",
    [VLLM_QUEUE_FULL, VLLM_PREFILL_BACKLOG, LLAMACPP_NO_SLOT],
    ids=["vllm-queue", "vllm-prefill", "llamacpp"],
)
async def test_busy_answers_wait_in_the_gateway_and_leave_the_circuit_closed(busy: dict[str, Any]) -> None:
    engines = Engines(a=[(503, busy)] * 3 + [(200, VERDICT)])
    app = create_app(settings(), engine_transport=httpx.MockTransport(engines))
    async with AsyncTestClient(app, timeout=30) as client:
        response = await client.post("/v1/moderations", json=BODY)
        ready = (await client.get("/readyz")).json()
        exposition = (await client.get("/metrics")).text

    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["modgate"]["action"] == "allow"
    assert engines.calls["a"] == 4
    assert [engine["circuit"] for engine in ready["engines"]] == ["closed"]
    assert busy_counts(exposition) == {"http://engine.test": 3.0}


async def test_a_busy_engine_hands_the_frame_to_another_without_opening_its_circuit() -> None:
    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json=VLLM_QUEUE_FULL)

    pool = pool_of(engine_slot(A, 1, busy), engine_slot(B, 1))  # each circuit opens at its first failure
    answered = []
    for index in range(4):
        async with pool.slot() as held:
            answer = await held.chat({"model": "m", "messages": []}, f"r{index}")
            answered.append(answer.engine)
    metrics = GatewayMetrics()
    register_pool_metrics(pool, metrics)
    registry = metrics.registry

    assert answered == [B, B, B, B]
    assert [engine.state for engine in pool.engines] == ["closed", "closed"]
    assert busy_counts(generate_latest(registry).decode()) == {A: 4.0, B: 0.0}  # asked first each time


async def test_an_engine_busy_past_the_queue_deadline_is_a_429_not_an_open_circuit() -> None:
    engines = Engines(a=[(503, VLLM_QUEUE_FULL)])
    app = create_app(
        settings(admission={"queue_timeout_s": 0.3}),
        engine_transport=httpx.MockTransport(engines),
    )
    async with AsyncTestClient(app, timeout=30) as client:
        responses = [await client.post("/v1/moderations", json=BODY) for _ in range(3)]
        ready = (await client.get("/readyz")).json()

    assert [response.status_code for response in responses] == [429, 429, 429]
    assert error_body(responses[-1])["code"] == "engine_busy"
    assert "Retry-After" in responses[-1].headers
    assert [engine["circuit"] for engine in ready["engines"]] == ["closed"]


async def test_a_503_that_is_not_a_busy_answer_still_counts_against_the_circuit() -> None:
    engines = Engines(a=[(503, {"error": {"message": "engine dead", "type": "InternalServerError"}})])
    app = create_app(settings(), engine_transport=httpx.MockTransport(engines))
    async with AsyncTestClient(app, timeout=30) as client:
        statuses = [(await client.post("/v1/moderations", json=BODY)).status_code for _ in range(3)]
        refused = await client.post("/v1/moderations", json=BODY)

    assert statuses[:2] == [503, 503]
    assert error_body(refused)["code"] == "circuit_open"
