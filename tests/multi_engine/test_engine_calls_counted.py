"""Every request the gateway sends to an engine is counted once in ``modgate_engine_calls_total``: a counting
reverse proxy between the gateway and a simulated engine (either wire) sees exactly as many."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.place_probe import CountingProxy
from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, image_input


def counted_calls(gateway_url: str) -> Counter[str]:
    """``modgate_engine_calls_total`` by purpose (calls refused by the circuit never reached the engine)."""
    text = httpx.get(f"{gateway_url}/metrics", timeout=10).text
    calls: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "modgate_engine_calls":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["outcome"] != "circuit_open":
                    calls[sample.labels["purpose"]] += int(sample.value)
    return calls


def settled(gateway_url: str, proxy: CountingProxy) -> tuple[Counter[str], Counter[str]]:
    """The gateway's count and the proxy's once both stop moving (background reads may be on their way)."""
    last: tuple[Counter[str], Counter[str]] | None = None
    for _ in range(100):
        now = (counted_calls(gateway_url), Counter(proxy.paths))
        if now == last and sum(now[0].values()) == sum(now[1].values()):
            return now
        last = now
        time.sleep(0.05)
    assert last is not None
    return last


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
def test_the_gateways_engine_call_count_equals_what_a_proxy_before_the_engine_sees(
    kind: str, start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim(kind=kind)
    proxy = CountingProxy(sim.url)
    with ThreadedServer(proxy) as front:
        gateway = start_gateway(
            engine={"url": front.url},
            telemetry={"engine_scrape_interval_s": 1.0},  # a few scrapes, none a moment from the reading
            shaping={"verdict_cache_ttl_s": 0},
        )
        with httpx.Client(base_url=gateway.url, timeout=60) as client:
            for seed in range(3):
                one = {"input": image_input(make_keyframe("allow", 320, 180, seed=seed))}
                assert client.post("/v1/moderations", json=one).status_code == 200
            packed = image_input(*(make_keyframe("allow", 320, 180, seed=10 + i) for i in range(3)))
            assert client.post("/v1/moderations", json={"input": packed}).status_code == 200
            assert client.post("/v1/moderations", json={"input": "some words to judge"}).status_code == 200
            assert client.get("/readyz").status_code in (200, 503)
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            assert client.get("/stats", headers=headers).status_code == 200
        gateway_calls, proxy_paths = settled(gateway.url, proxy)
    assert sum(gateway_calls.values()) == sum(proxy_paths.values()) > 0, (gateway_calls, proxy_paths)
    # per purpose where the path tells
    assert gateway_calls["metrics"] == proxy_paths["/metrics"]
    assert gateway_calls["health"] == proxy_paths["/health"]
    assert gateway_calls["models"] == proxy_paths["/v1/models"]
    assert gateway_calls["props"] == proxy_paths["/props"] + proxy_paths["/server_info"]
    assert gateway_calls["verdict"] >= 5
