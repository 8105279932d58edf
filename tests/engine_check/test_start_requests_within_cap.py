"""The gateway's own requests (the start-up check's probes, /readyz's first-request probe, the prefix primer)
take a slot of the engine's in-flight cap, as keyframes do: the engine never runs more than the cap."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.support import GatewayFactory, SimFactory

CAP = 2


def _info(engine: str) -> dict[str, Any]:
    info: dict[str, Any] = httpx.get(f"{engine}/sim/info", timeout=10).json()
    return info


def _moderate(gateway: str, index: int) -> int:
    text = f"第{index}条评论：" + "这段文字讨论天气和路况，没有别的内容。" * 12
    response = httpx.post(f"{gateway}/v1/moderations", json={"model": "m", "input": text}, timeout=120,
                          headers={"X-Modgate-Thinking": "off"})
    return response.status_code


def _readyz(gateway: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{gateway}/readyz", timeout=120).json()
    return body


def test_probes_and_primings_beside_keyframes_never_take_the_engine_past_its_cap(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    # A hybrid engine with a match unit: the start-up check probes it, /readyz sends it a first request, and
    # the gateway primes it at start and again once its cache is emptied, all while keyframes fill the cap.
    engine = start_sim("hybrid-cpu", time_scale=10.0, prefix_match_unit=16)
    gateway = start_gateway(
        queue_size=64, queue_timeout_s=120,
        engine={"url": engine.url, "max_inflight": CAP, "startup_check": True},
        shaping={"prefix_reprime_interval_s": 0.0, "verdict_cache_ttl_s": 0.0},
    )
    with ThreadPoolExecutor(max_workers=12) as pool:
        first = [pool.submit(_moderate, gateway.url, index) for index in range(6)]
        ready = [pool.submit(_readyz, gateway.url) for _ in range(3)]
        statuses = [future.result() for future in first]
        httpx.post(f"{engine.url}/sim/reset_prefix_cache", timeout=10)  # the state is lost: primed again
        statuses += [future.result() for future in [pool.submit(_moderate, gateway.url, 100 + index)
                                                    for index in range(6)]]
    assert statuses == [200] * 12
    for _ in range(300):  # the second priming runs beside the requests, after a slot frees: let it land
        body = _readyz(gateway.url)
        if body["prefix_cache"][engine.url]["primings"] >= 2:
            break
        time.sleep(0.05)
    # every kind of the gateway's own request was sent...
    assert body["engines"][0]["up"] is True
    assert "first_request" not in body["engines"][0]  # probed, and the engine answered it
    assert {check["check"] for check in body["engine_checks"]} >= {"structured_outputs", "cached_tokens"}
    assert body["prefix_cache"][engine.url]["primings"] >= 2
    assert [r.result()["prefix_cache"][engine.url]["strategy"] for r in ready] == ["prime"] * 3
    # ...and the engine never had more than the cap at once
    assert _info(engine.url)["peak_requests"] <= CAP
