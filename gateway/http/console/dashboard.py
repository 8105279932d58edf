"""What the console's page shows, read now: the policy, recent figures, engine health, audit, quality."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from litestar.di import NamedDependency

from gateway.engine.admission import AdmissionQueue
from gateway.engine.pool import EnginePool
from gateway.engine.prefix_keeper import PrefixKeeper
from gateway.engine.startup_check import EngineChecks
from gateway.errors import ModgateError
from gateway.http.console.sessions import QualityHeadline, latest_quality_headline
from gateway.http.tenant_figures import TenantFigures
from gateway.moderation.service import ModerationService
from gateway.policy.rules import AuditEntry, PolicyStore, ThinkingPolicy
from gateway.settings import Settings
from gateway.telemetry.windows import EngineCacheScraper, RecentRequests, stats_document


@dataclass(frozen=True, slots=True)
class Dashboard:
    """What the page shows, read now from the parts it watches (a dependency: Litestar fills each field with
    the part of its name, gateway/http/providers.py)."""

    settings: NamedDependency[Settings]
    policies: NamedDependency[PolicyStore]
    moderation: NamedDependency[ModerationService]
    engines: NamedDependency[EnginePool]
    admission: NamedDependency[AdmissionQueue]
    recent: NamedDependency[RecentRequests]
    engine_cache: NamedDependency[EngineCacheScraper]
    tenants: NamedDependency[TenantFigures]
    engine_checks: NamedDependency[EngineChecks]
    prefix: NamedDependency[PrefixKeeper]

    def figures(self) -> dict[str, Any]:
        """The recent window's figures (GET /stats's document), flattened for the templates."""
        stats = stats_document(self.recent, self.engine_cache)
        latency = stats.get("latency_ms", {})
        cache = stats.get("cache", {})

        def ms(name: str, quantile: str) -> float | None:
            value = latency.get(name, {}).get(quantile)
            return None if value is None else float(value)

        return {
            "window_s": stats.get("window_s"),
            "covered_s": stats.get("covered_s"),
            "keyframes": stats.get("keyframes", 0),
            "keyframes_per_minute": stats.get("keyframes_per_minute"),
            "e2e_p50": ms("end_to_end", "p50"), "e2e_p95": ms("end_to_end", "p95"),
            "ttft_p50": ms("ttft", "p50"), "ttft_p95": ms("ttft", "p95"),
            "queue_wait_p50": ms("queue_wait", "p50"), "queue_wait_p95": ms("queue_wait", "p95"),
            "thinking_share": stats.get("thinking_share"),
            "reused_share": stats.get("reused_share"),
            "escalation_share": stats.get("escalation", {}).get("share"),
            "escalations": stats.get("escalation", {}).get("escalated", 0),
            "escalations_skipped": stats.get("escalation", {}).get("skipped_by_cap", 0),
            "engine_hit_rate": cache.get("engine_window_hit_rate"),
            "engine_queries": cache.get("engine_window_queries"),
            "engine_block_size": cache.get("engine_block_size"),
            "engine_kind": cache.get("engine_kind"),
            "engine_block_note": cache.get("engine_block_note"),
            "engine_scrape_error": cache.get("engine_scrape_error"),
            "gateway_cached_share": cache.get("gateway_cached_share"),
            "inflight": self.admission.inflight,
            "queued": self.admission.queued,
            "max_inflight": sum(engine.cap for engine in self.engines.engines),
            "queue_size": self.settings.admission.queue_size,
        }

    async def health(self) -> dict[str, Any]:
        """Readiness as ``GET /readyz`` judges it: every engine's /health and circuit, and the model known."""
        engines = await self.engines.readiness()
        model: str | None = None
        model_error: str | None = None
        if any(engine["up"] for engine in engines):
            try:
                model = await self.moderation.engine_model()
            except ModgateError as exc:
                model_error = exc.message
        return {
            "engines": engines,
            "engines_up": sum(bool(engine["up"]) for engine in engines),
            "ready": model is not None,
            "model": model,
            "model_error": model_error,
            "store": self.policies.status(),
            "engine_checks": self.engine_checks.findings(),  # what the start-up check found on each engine
            "prefix": self.prefix.status(),  # per engine URL
        }

    async def audit(self) -> tuple[list[AuditEntry], str | None]:
        """The audit trail's newest rows, or none and why (the store is unreachable)."""
        try:
            return await self.policies.audit(self.settings.console.audit_rows), None
        except ModgateError as exc:  # Redis down: the page still shows everything else
            return [], exc.message

    async def view(self) -> dict[str, Any]:
        """Everything the page and its panels show, read now."""
        policy = self.policies.current()
        health, (audit, audit_error), quality = await asyncio.gather(
            self.health(),
            self.audit(),
            asyncio.to_thread(latest_quality_headline, self.settings.console.reports_dir),
        )
        return {
            "policy": policy,
            "policy_hash": policy.content_hash(),
            "shedding": self.moderation.load.shedding,
            "figures": self.figures(),
            "tenants": self.tenants.rows(),
            "fairness": self.settings.admission.fairness,
            "health": health,
            "audit": audit,
            "audit_error": audit_error,
            "quality": quality,
            "quality_advice": quality_advice(policy, quality),
            "reports_dir": self.settings.console.reports_dir,
            "poll_interval_s": self.settings.console.poll_interval_s,
            "now": datetime.now(UTC),
        }


def quality_advice(policy: ThinkingPolicy, quality: QualityHeadline | None) -> str | None:
    """A warning when the default mode goes against the newest report's recommendation."""
    if quality is None:
        return None
    if policy.default_mode == "off" and quality.decision != "thinking_off_ok":
        return f"Thinking is off, but the {quality.week} quality report says: {quality.title.lower()}."
    return None
