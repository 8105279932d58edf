"""Verdict reuse is scoped by the engine's model: new weights behind the same URL never reuse old verdicts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from gateway.cli.embedded import ThreadedServer
from tests.shaping_gateway.test_verdict_reuse import engine_requests, moderate
from tests.support import GatewayFactory, image_input

FRAME = make_keyframe("block:hate", 640, 360, seed=31)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Gateway settings for each verdict store: this process's memory, or a real Redis."""
    if request.param == "memory":
        return {}
    return {"redis_url": request.getfixturevalue("redis_url")}


class SwappableEngine:
    """A simulated engine on a fixed port that can be restarted serving another model (new weights)."""

    def __init__(self) -> None:
        self.server = ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)).start()
        self.url = self.server.url

    def swap(self, **preset_changes: Any) -> None:
        """Stop the engine and start another on the same port with ``preset_changes``."""
        port = self.server.port
        self.server.stop()
        app = create_sim_app(PRESETS["instant"].scaled(**preset_changes), 0.0)
        self.server = ThreadedServer(app, port=port).start()


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
