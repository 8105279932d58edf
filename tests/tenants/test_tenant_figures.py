"""Per-tenant figures: /metrics (read with prometheus_client's parser), /stats and the console break
latency, queue wait, throughput, thinking share and quota refusals down by tenant, named by the keys."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

KEYS = "key-a:tenant-a,key-b:tenant-b"


def moderate(gateway: ThreadedServer, key: str | None, thinking: str, seed: int) -> httpx.Response:
    headers = {"X-Modgate-Thinking": thinking, **({"Authorization": f"Bearer {key}"} if key else {})}
    body = {"input": image_input(make_keyframe("allow", 192, 108, seed=seed))}
    return httpx.post(f"{gateway.url}/v1/moderations", json=body, headers=headers, timeout=30)


def samples(gateway: ThreadedServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def traffic(gateway: ThreadedServer) -> None:
    for seed in range(3):
        assert moderate(gateway, "key-a", "on", seed).status_code == 200
    assert moderate(gateway, "key-b", "off", 10).status_code == 200
    assert moderate(gateway, "key-b", "off", 11).status_code == 429  # over tenant-b's quota of one


def test_metrics_break_figures_down_by_tenant(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS,
                            tenants={"weights": {"tenant-a": 2}, "keyframes_per_minute": {"tenant-b": 1}})
    traffic(gateway)
    metrics = samples(gateway)

    def value(name: str, **labels: str) -> float:
        return metrics[name, tuple(sorted(labels.items()))]

    assert value("modgate_tenant_frames_total", tenant="tenant-a", thinking="on") == 3
    assert value("modgate_tenant_frames_total", tenant="tenant-b", thinking="off") == 1
    assert value("modgate_tenant_request_seconds_count", tenant="tenant-a") == 3
    assert value("modgate_tenant_queue_wait_seconds_count", tenant="tenant-b") == 1
    assert value("modgate_tenant_weight", tenant="tenant-a") == 2
    assert value("modgate_tenant_window_thinking_share", tenant="tenant-a") == 1.0
    assert value("modgate_tenant_window_thinking_share", tenant="tenant-b") == 0.0
    assert value("modgate_tenant_window_keyframes_per_minute", tenant="tenant-a") > 0
    assert value("modgate_tenant_engine_work_total", tenant="tenant-a") > value(
        "modgate_tenant_engine_work_total", tenant="tenant-b")  # three thinking-on calls against one off
    assert value("modgate_tenant_quota_refusals_total", tenant="tenant-b", quota="keyframes_per_minute") == 1
    assert value("modgate_tenant_quota_refusals_total", tenant="tenant-a", quota="keyframes_per_minute") == 0
    assert value("modgate_tenant_quota_limit", tenant="tenant-b", quota="keyframes_per_minute") == 1
    tenants = {dict(labels).get("tenant") for (name, labels) in metrics if name.startswith("modgate_tenant_")}
    assert tenants == {"tenant-a", "tenant-b"}  # from the keys only


def test_a_tenant_named_in_a_request_is_not_a_label(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url)  # no keys: one tenant
    body = {"input": image_input(make_keyframe("allow", 192, 108)), "modgate": {"tags": ["mallory"]}}
    assert httpx.post(f"{gateway.url}/v1/moderations", json=body, timeout=30,
                      headers={"X-Tenant": "mallory"}).status_code == 200
    metrics = samples(gateway)
    tenants = {dict(labels).get("tenant") for (name, labels) in metrics if name.startswith("modgate_tenant_")}
    assert tenants == {"default"}
    rows = httpx.get(f"{gateway.url}/stats", timeout=10).json()["tenants"]
    assert [row["tenant"] for row in rows] == ["default"]


def test_stats_and_the_console_show_each_tenant(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS,
                            tenants={"weights": {"tenant-a": 2}, "keyframes_per_minute": {"tenant-b": 1}})
    traffic(gateway)
    stats = httpx.get(f"{gateway.url}/stats", timeout=10).json()
    assert stats["fairness"] == "tenant"
    rows: dict[str, Any] = {row["tenant"]: row for row in stats["tenants"]}
    a, b = rows["tenant-a"], rows["tenant-b"]
    assert a["keyframes"] == 3
    assert b["keyframes"] == 1
    assert a["thinking_share"] == 1.0
    assert b["thinking_share"] == 0.0
    assert a["latency_ms"]["end_to_end"]["count"] == 3
    assert a["latency_ms"]["end_to_end"]["p95"] > 0
    assert b["latency_ms"]["queue_wait"]["count"] == 1
    assert a["admission"]["granted"] == 3
    assert a["admission"]["work_share"] > b["admission"]["work_share"]
    assert b["quota"] == {"keyframes_per_minute": 1, "remaining_keyframes": 0, "max_concurrent": None,
                          "requests_under_way": 0, "refused": {"keyframes_per_minute": 1}}
    assert a["weight"] == 2.0
    assert b["weight"] == 1.0

    page = httpx.get(f"{gateway.url}/console", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert page.status_code == 200
    html = page.text
    row_a = html[html.index('id="tenant-tenant-a"'):html.index("</tr>", html.index('id="tenant-tenant-a"'))]
    row_b = html[html.index('id="tenant-tenant-b"'):html.index("</tr>", html.index('id="tenant-tenant-b"'))]
    assert "<td>2.0</td>" in row_a
    assert "100 %" in row_a  # weight, thinking share
    assert "0 %" in row_b
    assert "1 (0)" in row_b  # thinking share; quota 1 a minute, none left
    assert row_b.rstrip().endswith("<td>1</td>")  # one refusal
    panels = httpx.get(f"{gateway.url}/console/panels", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                       timeout=10).json()["panels"]
    assert 'id="tenant-tenant-a"' in panels["tenants"]
