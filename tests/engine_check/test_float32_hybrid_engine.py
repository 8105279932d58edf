"""A hybrid engine started in float32 is caught by the gateway's start-up probe, naming float32 and the fix.

The simulator answers as the real vLLM CPU build did: ``/health`` 200 until the first generation request,
that request 500 with vLLM's own body, then the server exits (``/health`` refused).
"""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from deploy.simulator.app import ENGINE_CORE_FAILED
from gateway.engine.first_request import HYBRID_ON_CPU_NEEDS_BF16
from tests.support import GatewayFactory, SimFactory, SwappableEngine


def test_the_simulated_float32_hybrid_answers_its_first_request_as_vllm_does_then_exits(
    start_sim: SimFactory,
) -> None:
    engine = start_sim("hybrid-cpu", dtype="float32")
    assert httpx.get(f"{engine.url}/health", timeout=10).status_code == 200
    answer = httpx.post(f"{engine.url}/v1/chat/completions", timeout=10, json={
        "model": "tiny", "messages": [{"role": "user", "content": "ok"}], "max_tokens": 1,
    })
    assert answer.status_code == 500
    assert answer.json() == {"error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError", "param": None, "code": 500,
    }} == ENGINE_CORE_FAILED
    refused = False
    for _ in range(500):  # the server exits within a moment of that answer
        try:
            httpx.get(f"{engine.url}/health", timeout=1)
        except httpx.ConnectError:
            refused = True
            break
    assert refused


def test_a_float32_hybrid_engine_is_caught_at_start_and_readyz_keeps_saying_why_after_it_exited(
    start_sim: SimFactory, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    engine = start_sim("hybrid-cpu", dtype="float32", prefix_match_unit=16)
    with caplog.at_level(logging.ERROR, logger="modgate.engine"):
        gateway = start_gateway(engine={"startup_check": True, "url": engine.url})
    # said once in the log at start, before any keyframe, with the fix
    said = [r.message for r in caplog.records if HYBRID_ON_CPU_NEEDS_BF16 in r.message]
    assert len(said) == 1
    assert "float32" in said[0]
    assert "--dtype bfloat16" in said[0]
    assert "EngineCore encountered an issue" in said[0]
    for _ in range(2):  # the engine has exited: /readyz still names the cause, every time it is asked
        ready = httpx.get(f"{gateway.url}/readyz", timeout=30)
        assert ready.status_code == 503
        (entry,) = ready.json()["engines"]
        assert entry["health"] is False
        assert entry["first_request"]["status"] == "failed"
        assert entry["first_request"]["detail"].endswith(HYBRID_ON_CPU_NEEDS_BF16)


def test_an_engine_that_comes_up_after_the_gateway_gets_the_probe_before_the_primer(
    start_gateway: GatewayFactory,
) -> None:
    # The engine is loading when the gateway starts; it comes up as a float32 hybrid with a match unit, and
    # stays up after its core died (vLLM with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1: /health 503, chat 500).
    engine = SwappableEngine()
    engine.stop()
    try:
        gateway = start_gateway(engine={"model_recheck_s": 0.2, "startup_check": True, "url": engine.url})
        engine.start(mamba_cache_mode="align", block_size=1024, prefix_match_unit=16, dtype="float32")
        for _ in range(300):  # the gateway notices it and sends it its first request
            if httpx.get(f"{engine.url}/health", timeout=10).status_code == 503:
                break
            time.sleep(0.05)
        time.sleep(1.0)  # what the gateway does next (a primer, a check) reaches a dead engine core
        ready = httpx.get(f"{gateway.url}/readyz", timeout=30).json()
        (entry,) = ready["engines"]
        assert entry["first_request"]["status"] == "failed", ready
        assert entry["first_request"]["detail"].endswith(HYBRID_ON_CPU_NEEDS_BF16)
        assert ready["prefix_cache"][engine.url]["primings"] == 0  # never primed: the probe came first
    finally:
        engine.stop()
