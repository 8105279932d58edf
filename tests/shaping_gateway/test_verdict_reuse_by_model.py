"""Verdict reuse is scoped by the engine's model: new weights behind the same URL never reuse old verdicts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.shaping_gateway.test_verdict_reuse import engine_requests, moderate
from tests.support import GatewayFactory, SwappableEngine, image_input

FRAME = make_keyframe("block:hate", 640, 360, seed=31)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Gateway settings for each verdict store: this process's memory, or a real Redis."""
    if request.param == "memory":
        return {}
    return {"redis_url": request.getfixturevalue("redis_url")}


@pytest.fixture
def engine() -> Iterator[SwappableEngine]:
    swappable = SwappableEngine()
    yield swappable
    swappable.server.stop()


def wait_for_model(gateway: ThreadedServer, wanted: dict[str, str]) -> None:
    """Poll /readyz until the gateway has re-read the engine's model (it does every model_recheck_s)."""
    deadline = time.monotonic() + 20
    seen: Any = None
    while time.monotonic() < deadline:
        seen = httpx.get(f"{gateway.url}/readyz", timeout=10).json().get("model")
        if seen is not None and all(seen.get(k) == v for k, v in wanted.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"the gateway never saw the engine's new model {wanted}: /readyz says {seen}")


@pytest.mark.parametrize(
    "new_weights",
    [{"model": "qwen3-vl-moe-sim-v2"}, {"model_root": "/weights/qwen3-vl-moe-sim@2026-12-01"}],
    ids=["other-model-id", "same-id-other-root"],
)
def test_new_weights_behind_the_same_url_judge_afresh(
    store: dict[str, Any], engine: SwappableEngine, start_gateway: GatewayFactory, new_weights: dict[str, str]
) -> None:
    gateway = start_gateway(engine_url=engine.url, engine={"model_recheck_s": 0.2}, **store)
    assert moderate(gateway, FRAME)["reused"] is None
    assert moderate(gateway, FRAME)["reused"] == "exact"  # same model: reused
    engine.swap(**new_weights)
    wait_for_model(gateway, {"id": new_weights.get("model", "qwen3-vl-moe-sim")})
    wait_for_model(gateway, {"root": new_weights.get("model_root", new_weights.get("model", ""))})
    after = moderate(gateway, FRAME)
    assert after["reused"] is None  # judged by the new model, not served from the old one's verdicts
    assert engine_requests(engine.server) == 1
    assert moderate(gateway, FRAME)["reused"] == "exact"  # and the new model's verdict is reused in turn


def test_a_configured_model_revision_scopes_reuse_across_replicas(
    redis_url: str, engine: SwappableEngine, start_gateway: GatewayFactory
) -> None:
    old = start_gateway(engine_url=engine.url, redis_url=redis_url, engine={"model_revision": "r1"})
    new = start_gateway(engine_url=engine.url, redis_url=redis_url, engine={"model_revision": "r2"})
    same = start_gateway(engine_url=engine.url, redis_url=redis_url, engine={"model_revision": "r1"})
    assert moderate(old, FRAME)["reused"] is None
    assert moderate(new, FRAME)["reused"] is None  # another revision: not reused through the shared Redis
    assert moderate(same, FRAME)["reused"] == "exact"  # the same revision: reused
    assert engine_requests(engine.server) == 2


def test_an_engine_failure_makes_the_gateway_read_the_model_again(
    engine: SwappableEngine, start_gateway: GatewayFactory
) -> None:
    # Re-read only after an hour, or after a failed engine call: the swapped engine refuses the old model's
    # name (404), and the gateway reads /v1/models again before its next request.
    gateway = start_gateway(engine_url=engine.url, engine={"model_recheck_s": 3600})
    assert moderate(gateway, FRAME)["reused"] is None
    engine.swap(model="qwen3-vl-moe-sim-v2")
    other = make_keyframe("allow", 640, 360, seed=32)  # not cached: this one reaches the engine
    refused = httpx.post(f"{gateway.url}/v1/moderations", json={"input": image_input(other)}, timeout=60)
    assert refused.status_code >= 400
    wait_for_model(gateway, {"id": "qwen3-vl-moe-sim-v2"})
    assert moderate(gateway, FRAME)["reused"] is None


def test_a_verdict_llamacpp_made_in_a_mixed_pool_is_never_reused_by_a_pool_without_llamacpp(
    redis_url: str, mixed: tuple[SwappableEngine, SwappableEngine], start_gateway: GatewayFactory
) -> None:
    """The verdict is kept under the model of the engine that made it, not of the pool's first engine: a
    gateway whose only engine is vLLM (sharing the verdict store) must not hand out llama.cpp's verdict."""
    vllm, llamacpp = mixed
    # models read once, with both engines up (no re-read while the test runs)
    both = start_gateway(
        engine_url=f"{vllm.url},{llamacpp.url}", redis_url=redis_url, engine={"model_recheck_s": 3600}
    )
    alone = start_gateway(engine_url=vllm.url, redis_url=redis_url)
    assert moderate(both, make_keyframe("allow", 640, 360, seed=33))["reused"] is None
    vllm.stop()  # the pool's first engine: this frame can only be judged by llama.cpp
    assert moderate(both, FRAME)["reused"] is None
    assert llamacpp.used()
    vllm.start()
    assert moderate(alone, FRAME)["reused"] is None  # judged by vLLM, not served llama.cpp's verdict
    assert vllm.used()
    assert moderate(alone, FRAME)["reused"] == "exact"  # vLLM's own verdict is reused in turn


def test_a_mixed_pool_reuses_each_engines_verdicts_until_that_engine_serves_other_weights(
    mixed: tuple[SwappableEngine, SwappableEngine], start_gateway: GatewayFactory
) -> None:
    vllm, llamacpp = mixed
    gateway = start_gateway(engine_url=f"{vllm.url},{llamacpp.url}", engine={"model_recheck_s": 0.2})
    by_vllm = make_keyframe("allow", 640, 360, seed=33)
    assert moderate(gateway, by_vllm)["reused"] is None  # both idle: the engine listed first takes it
    assert vllm.used()
    assert not llamacpp.used()
    served = [e["model"] for e in httpx.get(f"{gateway.url}/readyz", timeout=10).json()["engines"]]
    assert [m["id"] for m in served] == ["qwen3-vl-moe-sim"] * 2  # one model id, two identities:
    assert served[1]["root"].startswith("llamacpp:")
    assert served[0]["root"] != served[1]["root"]
    vllm.stop()
    assert moderate(gateway, FRAME)["reused"] is None  # judged by llama.cpp
    assert llamacpp.used()
    vllm.start()
    # either engine could take the next request: each one's verdict answers it
    assert moderate(gateway, FRAME)["reused"] == "exact"
    assert moderate(gateway, by_vllm)["reused"] == "exact"
    llamacpp.swap(model_root="/weights/qwen3-vl-moe-sim@2026-12-01")  # llama.cpp: another GGUF, same id
    deadline = time.monotonic() + 20
    while moderate(gateway, FRAME)["reused"] is not None:  # until the gateway has re-read llama.cpp's model
        assert time.monotonic() < deadline, "the old GGUF's verdict was still reused 20 s after the swap"
        time.sleep(0.1)
    assert moderate(gateway, by_vllm)["reused"] == "exact"  # vLLM serves what it did: its verdict stands


def test_each_engine_of_a_mixed_pool_is_asked_for_its_own_model_id(
    mixed: tuple[SwappableEngine, SwappableEngine], start_gateway: GatewayFactory
) -> None:
    """llama.cpp listed first under another name (its alias): a request that moves to vLLM names vLLM's
    model, not the first engine's (vLLM answers 404 to a name it does not serve)."""
    vllm, llamacpp = mixed
    llamacpp.swap(model="qwen3-vl-gguf-alias")
    gateway = start_gateway(engine_url=f"{llamacpp.url},{vllm.url}", engine={"model_recheck_s": 3600})
    assert moderate(gateway, make_keyframe("allow", 640, 360, seed=34))["reused"] is None
    assert llamacpp.used()  # both idle: the engine listed first took it
    served = [e["model"]["id"] for e in httpx.get(f"{gateway.url}/readyz", timeout=10).json()["engines"]]
    assert served == ["qwen3-vl-gguf-alias", "qwen3-vl-moe-sim"]
    llamacpp.stop()  # the next frame can only be judged by vLLM, under its own name
    assert moderate(gateway, FRAME)["reused"] is None
    assert vllm.used()
