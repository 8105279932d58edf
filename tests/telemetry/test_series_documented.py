"""docs/telemetry.md's table names every series the gateway declares (gateway/series/), and no other."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.series.metrics import GatewayMetrics
from gateway.series.review import ReviewMetrics
from gateway.series.scraped import (
    EngineReading,
    PoolReading,
    SharedCapReading,
    TenantReading,
    WindowReading,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def declared() -> set[str]:
    """Every family the gateway's registry exposes, the scrape-time ones read with every reading present."""
    metrics = GatewayMetrics()
    ReviewMetrics(metrics.registry, 3600)
    engine = EngineReading(url="http://engine", inflight=1, cap=8, up=True, failovers=0, busy=0)
    metrics.watch_pool(lambda: PoolReading((engine,), SharedCapReading(local_only=False, outside=0)))
    metrics.watch_tenants(lambda: [TenantReading(
        tenant="acme", weight=1.0, queued=0, inflight=0, work_served=0.0, keyframes_per_minute=0.0,
        thinking_share=None, e2e_p95_s=None, queue_wait_p95_s=None, quotas={}, refused={},
    )])
    metrics.watch_window(lambda: WindowReading(
        window_s=300, prompt_cached_ratio=None, engine_hit_ratio=None, engine_queried_tokens=0.0,
        keyframes_per_minute=0.0, thinking_share=None, escalation_share=None, thinking_default_on=False,
        kv_block_size=16,
    ))
    return {family.name for family in metrics.registry.collect()}


def documented(page: str) -> set[str]:
    """The ``modgate_*`` series a page names, as their families (``x_total`` and ``x_bucket`` are ``x``); a
    prefix (``modgate_window_*``) names none."""
    names = set()
    for name in re.findall(r"\bmodgate_[a-z0-9_]*[a-z0-9](?![a-z0-9_*])", page):
        for suffix in SUFFIXES:
            name = name.removesuffix(suffix)
        names.add(name)
    return names


def test_the_page_names_every_declared_series_and_no_other() -> None:
    families, named = declared(), documented(PAGE.read_text())

    assert len(families) > 70
    assert sorted(families - named) == [], "document these in docs/telemetry.md's table"
    assert sorted(named - families) == [], "docs/telemetry.md names series the gateway does not declare"


def test_a_series_left_out_of_the_page_or_named_but_gone_is_caught() -> None:
    page = PAGE.read_text()
    left_out = page.replace("`modgate_job_requests_total{kind,outcome}`", "")
    gone = page + "\n| old | `modgate_video_jobs_total{status,code}` | |\n"

    assert "modgate_job_requests" in declared() - documented(left_out)
    assert documented(gone) - declared() == {"modgate_video_jobs"}
