"""The gauges the alert rules compare with (deploy/monitoring/modgate-rules.yaml), read from a live gateway's
``/metrics``: the queue's size, the policy's shadow share, the load rule shedding thinking, and the prefix
tokens every call should take from the cache."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from gateway.policy.rules import MODES
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def gauge(gateway: ThreadedServer, name: str, **labels: str) -> float | None:
    """One sample of ``/metrics`` (None: not there)."""
    for family in text_string_to_metric_families(httpx.get(f"{gateway.url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def flip(gateway: ThreadedServer, **fields: Any) -> None:
    current = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN).json()
    body = {**current, **fields, "reason": "alert metrics test"}
    response = httpx.put(f"{gateway.url}/admin/thinking-policy", json=body, headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text


def moderate(gateway: ThreadedServer, seed: int, **headers: str) -> httpx.Response:
    body = {"input": image_input(make_keyframe("allow", 640, 360, seed=seed))}
    return httpx.post(f"{gateway.url}/v1/moderations", json=body, headers=headers, timeout=60)


def test_the_queue_size_is_the_admission_setting(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, admission={"queue_size": 17})

    assert gauge(gateway, "modgate_engine_queue_size") == 17


def test_the_shadow_share_follows_the_policy_in_force(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    assert gauge(gateway, "modgate_policy_shadow_share") == 0

    flip(gateway, shadow_share=0.25)

    assert gauge(gateway, "modgate_policy_shadow_share") == 0.25


def test_load_shedding_reads_1_while_the_load_rule_holds_thinking_off_and_0_after(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    slow = start_sim(faults=Faults(slow_rate=1.0, slow_s=2.0))
    gateway = start_gateway(engine_url=slow.url, max_inflight=1, shaping={"verdict_cache_ttl_s": 0})
    flip(gateway, load={"enabled": True, "queue_depth_high": 1, "queue_depth_low": 0})
    assert gauge(gateway, "modgate_thinking_load_shedding") == 0

    def staggered(seed: int) -> httpx.Response:
        time.sleep(0.4 * seed)  # each decides after the ones before have queued for the one slot
        return moderate(gateway, seed)

    with ThreadPoolExecutor(max_workers=5) as pool:
        answers = list(pool.map(staggered, range(5)))
    assert all(answer.status_code == 200 for answer in answers)
    assert gauge(gateway, "modgate_thinking_load_shedding") == 1  # until a decision sees the queue empty
    moderate(gateway, 10)

    assert gauge(gateway, "modgate_thinking_load_shedding") == 0


def test_the_cacheable_prefix_is_what_each_call_then_takes_from_the_cache(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    engine = start_sim("spark")
    plain = start_gateway(engine_url=engine.url)
    filled = start_gateway(engine_url=engine.url, shaping={"block_filling_prefix": True})
    answers = [moderate(filled, seed, **{"X-Modgate-Thinking": "off"}).json() for seed in (1, 2)]
    cached = [answer["results"][0]["modgate"]["cached_tokens"] for answer in answers]

    assert gauge(plain, "modgate_prefix_cacheable_tokens", verdict_format="compact") == 0
    assert gauge(filled, "modgate_prefix_cacheable_tokens", verdict_format="compact") == cached[-1] == 2960


def test_the_default_mode_gauge_marks_the_policys_mode_and_only_it(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    flip(gateway, default_mode="escalate")

    modes = {mode: gauge(gateway, "modgate_thinking_default_mode", mode=mode) for mode in MODES}

    assert modes == {"on": 0, "off": 0, "escalate": 1}
    assert gauge(gateway, "modgate_thinking_default_on") == 0
