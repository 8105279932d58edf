"""The rules and the dashboard on Debian's real Prometheus scraping a live gateway: every rule evaluates
without error (what promtool's parse cannot see: vector matching), every panel query answers, and the
rendering of docs/telemetry.md draws from those answers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.dashboard_run import prometheus
from deploy.keyframes import make_keyframe
from deploy.monitoring.prometheusrule import DASHBOARD
from deploy.monitoring.render import query_range, render
from tests.monitoring.promql import dashboard_queries, rules
from tests.processes import poll
from tests.support import GatewayFactory, SimFactory, image_input


@pytest.fixture
def prom(start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path) -> Iterator[str]:
    """A Prometheus that has scraped a gateway with traffic and evaluated the rules at least twice."""
    gateway = start_gateway(engine={"url": start_sim().url})
    for seed in range(3):
        body = {"input": image_input(make_keyframe("allow", 320, 180, seed=seed))}
        assert httpx.post(f"{gateway.url}/v1/moderations", json=body, timeout=30).status_code == 200
    with prometheus(gateway.url.removeprefix("http://"), tmp_path) as url:
        poll(lambda: _evaluated_twice(url), 60, "Prometheus to evaluate the rules twice", every_s=0.5)
        yield url


def _evaluated_twice(url: str) -> bool:
    """Two scrapes of the gateway (so rates have two points) and every rule group evaluated since."""
    samples = httpx.get(f"{url}/api/v1/query", params={"query": "count_over_time(up[1m])"}).json()
    groups = httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"]
    scraped = [float(result["value"][1]) for result in samples["data"]["result"]]
    return bool(scraped) and scraped[0] >= 3 and all(group["lastEvaluation"] > "2000" for group in groups)


def test_every_rule_evaluates_without_error(prom: str) -> None:
    time.sleep(6)  # one more evaluation round (5 s), after series exist
    groups = httpx.get(f"{prom}/api/v1/rules").json()["data"]["groups"]
    answered: list[dict[str, Any]] = [rule for group in groups for rule in group["rules"]]

    assert len(answered) == len(rules())
    assert [(rule["name"], rule.get("lastError")) for rule in answered if rule["health"] != "ok"] == []


def test_every_panel_query_answers_and_the_rendering_draws_them(prom: str, tmp_path: Path) -> None:
    now = time.time()
    with httpx.Client(base_url=prom, timeout=30) as http:
        answered = {expr: query_range(http, expr, "", now - 60, now, 5) for _, expr in dashboard_queries()}
    out = tmp_path / "dashboard.png"

    render(json.loads(DASHBOARD.read_text()), prom, now - 60, now, 5, out, "test rendering")

    assert answered
    assert answered[dashboard_queries()[0][1]], "keyframes a minute: no series after traffic"
    assert out.read_bytes().startswith(b"\x89PNG")
