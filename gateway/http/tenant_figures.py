"""Per-tenant figures for ``GET /stats``, ``GET /metrics`` and the console, read at request time.

Tenants are the directory's (named by the API keys) plus any seen in the recent window or the queues, which
also came from keys: the label set is bounded by the keys, never by what a request says.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.engine.admission import AdmissionQueue
from gateway.engine.fairness import SHARED_FLOW
from gateway.http.quotas import TenantQuotas
from gateway.moderation.shaping_pool import ShapingPool
from gateway.telemetry.windows import RecentRequests, WindowSummary, tenant_document


class TenantFigures:
    """What each tenant gets and uses now: its share of the engine, its quotas, its recent figures."""

    def __init__(self, admission: AdmissionQueue, quotas: TenantQuotas, recent: RecentRequests,
                 shaping: ShapingPool | None = None) -> None:
        self.admission = admission
        self.quotas = quotas
        self.recent = recent
        self.shaping = shaping

    def tenants(self, recent: dict[str, WindowSummary]) -> list[str]:
        """Every tenant to show: known from the keys, or seen in the window or the queues."""
        seen = set(self.quotas.directory.names()) | set(recent)
        seen |= {flow for flow in self.admission.figures() if flow != SHARED_FLOW}
        return sorted(seen)

    def rows(self) -> list[dict[str, Any]]:
        """One document per tenant (``GET /stats`` ``tenants``, the console's table)."""
        flows = self.admission.figures()
        recent = self.recent.by_tenant()
        empty = self.recent.summary_of([])
        shaping_queued = self.shaping.queued() if self.shaping is not None else {}
        total_work = sum(flow.work_served for name, flow in flows.items() if name != SHARED_FLOW)
        rows = []
        for tenant in self.tenants(recent):
            limits = self.quotas.directory.limits(tenant)
            flow = flows.get(tenant)
            state = self.quotas.last_state.get(tenant)
            row = {
                "tenant": tenant,
                "weight": limits.weight,
                **tenant_document(recent.get(tenant, empty)),
                "admission": {
                    "queued": 0 if flow is None else flow.queued,
                    "inflight": 0 if flow is None else flow.inflight,
                    "granted": 0 if flow is None else flow.granted,
                    "work_share": (None if flow is None or total_work <= 0
                                   else round(flow.work_served / total_work, 4)),
                },
                "shaping_queued": shaping_queued.get(tenant, 0),
                "quota": {
                    "keyframes_per_minute": limits.keyframes_per_minute or None,
                    "remaining_keyframes": None if state is None or not limits.keyframes_per_minute
                    else state.remaining,
                    "max_concurrent": limits.max_concurrent or None,
                    "requests_under_way": self.quotas.inflight.get(tenant, 0),
                    "refused": {quota: count for (name, quota), count in self.quotas.refused.items()
                                if name == tenant},
                },
            }
            rows.append(row)
        return rows

    def collect(self) -> Iterator[Metric]:
        """``modgate_tenant_*`` gauges and counters (label ``tenant``; ``quota`` for refusals)."""
        def gauge(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=["tenant"])

        weight = gauge("modgate_tenant_weight", "The tenant's weight in the fair share of engine work.")
        queued = gauge("modgate_tenant_queued", "Engine calls of the tenant waiting for a slot.")
        inflight = gauge("modgate_tenant_inflight", "Engine calls of the tenant holding a slot.")
        work = CounterMetricFamily(
            "modgate_tenant_engine_work",
            "Engine work served, in prompt-token equivalents (prompt + weight x output tokens).",
            labels=["tenant"],
        )
        rate = gauge("modgate_tenant_window_keyframes_per_minute", "Keyframes a minute, recent window.")
        thinking = gauge("modgate_tenant_window_thinking_share",
                         "Engine-judged keyframes with thinking on, recent window (NaN: none).")
        e2e_p95 = gauge("modgate_tenant_window_e2e_p95_seconds", "End-to-end p95, recent window (NaN: none).")
        wait_p95 = gauge("modgate_tenant_window_queue_wait_p95_seconds",
                         "Wait for an engine slot, p95, recent window (NaN: none).")
        limit = GaugeMetricFamily("modgate_tenant_quota_limit", "The tenant's quota (0: none).",
                                  labels=["tenant", "quota"])
        refused = CounterMetricFamily("modgate_tenant_quota_refusals",
                                      "Requests refused over a quota (429; 400 if larger than it).",
                                      labels=["tenant", "quota"])
        flows = self.admission.figures()
        recent = self.recent.by_tenant()
        empty = self.recent.summary_of([])
        for tenant in self.tenants(recent):
            limits = self.quotas.directory.limits(tenant)
            flow = flows.get(tenant)
            summary = recent.get(tenant, empty)
            weight.add_metric([tenant], limits.weight)
            queued.add_metric([tenant], 0 if flow is None else flow.queued)
            inflight.add_metric([tenant], 0 if flow is None else flow.inflight)
            work.add_metric([tenant], 0.0 if flow is None else flow.work_served)
            rate.add_metric([tenant], summary.keyframes_per_minute)
            share = summary.thinking_share
            thinking.add_metric([tenant], math.nan if share is None else share)
            p95 = summary.latencies["end_to_end"].p95
            e2e_p95.add_metric([tenant], math.nan if p95 is None else p95)
            wait = summary.latencies["queue_wait"].p95
            wait_p95.add_metric([tenant], math.nan if wait is None else wait)
            limit.add_metric([tenant, "keyframes_per_minute"], limits.keyframes_per_minute)
            limit.add_metric([tenant, "max_concurrent"], limits.max_concurrent)
            for quota in ("keyframes_per_minute", "max_concurrent"):
                refused.add_metric([tenant, quota], self.quotas.refused.get((tenant, quota), 0))
        yield from (weight, queued, inflight, work, rate, thinking, e2e_p95, wait_p95, limit, refused)
