"""Per-tenant figures for ``GET /stats``, ``GET /metrics`` and the console, read at request time.

Tenants are the directory's (named by the API keys) plus any seen in the recent window or the queues, which
also came from keys: the label set is bounded by the keys, never by what a request says.
"""

from __future__ import annotations

from typing import Any

from gateway.engine.admission import AdmissionQueue
from gateway.engine.fairness import SHARED_FLOW
from gateway.http.quotas import TenantQuotas
from gateway.moderation.shaping_pool import ShapingPool
from gateway.series.scraped import QUOTAS, TenantReading
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

    def readings(self) -> list[TenantReading]:
        """Each tenant's figures now, for the ``modgate_tenant_*`` series (gateway/series/scraped.py)."""
        flows = self.admission.figures()
        recent = self.recent.by_tenant()
        empty = self.recent.summary_of([])
        readings = []
        for tenant in self.tenants(recent):
            limits = self.quotas.directory.limits(tenant)
            flow = flows.get(tenant)
            summary = recent.get(tenant, empty)
            readings.append(TenantReading(
                tenant=tenant,
                weight=limits.weight,
                queued=0 if flow is None else flow.queued,
                inflight=0 if flow is None else flow.inflight,
                work_served=0.0 if flow is None else flow.work_served,
                keyframes_per_minute=summary.keyframes_per_minute,
                thinking_share=summary.thinking_share,
                e2e_p95_s=summary.latencies["end_to_end"].p95,
                queue_wait_p95_s=summary.latencies["queue_wait"].p95,
                quotas={"keyframes_per_minute": limits.keyframes_per_minute,
                        "max_concurrent": limits.max_concurrent},
                refused={quota: self.quotas.refused.get((tenant, quota), 0) for quota in QUOTAS},
            ))
        return readings
