"""Every metric an alert rule or a dashboard panel names is in a running gateway's real ``/metrics``, after
traffic that includes refusals (429: quota and overload) and failures."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from tests.monitoring.promql import (
    SCRAPE_SERIES,
    dashboard_queries,
    exposed,
    families_in,
    names_in,
    rules,
)
from tests.support import GatewayFactory, SimFactory, image_input

KEYS = "key-a:acme,key-b:globex"


def post(gateway: ThreadedServer, key: str, body: object) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/moderations", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


@pytest.fixture
def scraped(start_sim: SimFactory, start_gateway: GatewayFactory, redis_url: str) -> str:
    """``/metrics`` of a gateway (with Redis) after ok answers, a 400, quota 429s and overload 429s."""
    slow = start_sim(faults=Faults(slow_rate=1.0, slow_s=1.0))
    gateway = start_gateway(
        engine_url=slow.url,
        redis_url=redis_url,
        api_keys=KEYS,
        max_inflight=1,
        admission={"queue_size": 0},
        shaping={"verdict_cache_ttl_s": 0},
        tenants={"keyframes_per_minute": {"globex": 1}},
    )
    frame = {"input": image_input(make_keyframe("allow", 320, 180, seed=3))}
    assert post(gateway, "key-a", frame).status_code == 200
    assert post(gateway, "key-a", {"input": 5}).status_code == 400
    assert post(gateway, "key-b", frame).status_code == 200
    assert post(gateway, "key-b", frame).status_code == 429  # over globex's 1 keyframe a minute
    with ThreadPoolExecutor(max_workers=3) as pool:  # three at once for one slot and no waiting room
        statuses = [
            response.status_code for response in pool.map(lambda _: post(gateway, "key-a", frame), range(3))
        ]
    assert 429 in statuses
    response = httpx.get(f"{gateway.url}/metrics")
    assert response.status_code == 200
    return response.text


def test_every_metric_a_rule_or_a_panel_names_is_on_the_gateways_metrics(scraped: str) -> None:
    families = families_in(scraped)
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    named = {name for rule in rules() for name in names_in(rule["expr"])}
    named |= {name for _, expr in dashboard_queries() for name in names_in(expr)}

    missing = sorted(name for name in named - recorded - SCRAPE_SERIES if not exposed(name, families))

    assert len(named) > 30
    assert missing == []


def test_the_traffic_left_the_series_the_alerts_count(scraped: str) -> None:
    lines = scraped.splitlines()

    assert any(line.startswith('modgate_requests_total{outcome="overloaded"') for line in lines)
    assert any(
        line.startswith('modgate_tenant_quota_refusals_total{quota="keyframes_per_minute",tenant="globex"}')
        and not line.endswith(" 0.0")
        for line in lines
    )
    assert any(
        line.startswith("modgate_request_seconds_bucket{") and 'le="15.0"' in line and 'outcome="ok"' in line
        for line in lines
    )
    assert "modgate_engine_leases_local_only 0.0" in lines
    assert "modgate_engine_calls_outside_shared_cap 0.0" in lines
    assert "modgate_engine_queue_size 0.0" in lines
