"""Health, readiness, metrics and recent stats."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

from litestar import Response, get
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from prometheus_client import generate_latest

from gateway.drain import Drain
from gateway.engine.admission import AdmissionQueue
from gateway.engine.first_request import FirstRequestProbe
from gateway.engine.pool import EnginePool
from gateway.engine.prefix_keeper import PrefixKeeper
from gateway.engine.startup_check import EngineChecks
from gateway.errors import ModgateError, StateUnavailable
from gateway.http.tenant_figures import TenantFigures
from gateway.moderation.service import ModerationService
from gateway.policy.rules import PolicyStore
from gateway.review.service import ReviewQueue
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.telemetry.windows import EngineCacheScraper, RecentRequests, stats_document

_REVIEW_READ_S: Final = 1.0  # how long a scrape waits for the review queue's figures


@get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@get("/readyz", responses={503: ResponseSpec(data_container=dict[str, Any], description=(
    "Not ready: draining after SIGTERM, no engine is up, or the engine's model cannot be read (the body says"
    " which)"
))})
async def readyz(
    drain: NamedDependency[Drain], engines: NamedDependency[EnginePool],
    first_request: NamedDependency[FirstRequestProbe], moderation: NamedDependency[ModerationService],
    engine_checks: NamedDependency[EngineChecks], prefix: NamedDependency[PrefixKeeper],
    policies: NamedDependency[PolicyStore],
) -> Response[dict[str, Any]]:
    """Ready when at least one engine is up (answers ``/health``, circuit not open) and the model is known,
    and the process is not draining (after SIGTERM: 503 at once, while requests are still served)."""
    first = engines.engines[0].client.base_url  # "engine" is the first one
    if drain.active:
        return Response(
            {"status": "draining", "engine": first, "drain_remaining_s": round(drain.remaining_s(), 3)},
            status_code=503,
        )
    readiness = await engines.readiness()
    await _first_requests(engines, first_request, readiness)
    ready = any(engine["up"] for engine in readiness)
    model = None
    if ready:
        try:
            model = await moderation.engine_identity()
        except ModgateError:
            ready = False
    status = "ready" if ready else "not ready"
    body: dict[str, Any] = {"status": status, "engine": first, "engines": readiness}
    if model is not None:  # what requests name; verdicts are reused under each engine's own model
        body["model"] = {"id": model.id, "root": model.root, "revision": model.revision}
        for engine in readiness:
            served = moderation.identity.models.get(engine["url"])
            if served is not None:
                engine["model"] = {"id": served.id, "root": served.root, "revision": served.revision}
    # The policy store does not gate readiness (a replica serves on its last policy while Redis is down),
    # but an operator should see that flips are refused: "degraded".
    # What the start-up check found on each engine (gateway/engine/startup_check.py): a missing piece does
    # not gate readiness (the gateway serves what it can); each says its fix and what is lost until then.
    body["engine_checks"] = engine_checks.findings()
    # each engine's prefix strategy: primed or not, or the flag it needs
    body["prefix_cache"] = prefix.status()
    store = policies.status()
    body["policy_store"] = store.model_dump(mode="json")
    if ready and not store.available:
        body["status"] = "degraded"
    return Response(body, status_code=200 if ready else 503)


async def _first_requests(
    engines: EnginePool, first_request: FirstRequestProbe, readiness: list[dict[str, Any]]
) -> None:
    """Probe each engine that answers ``/health`` once with a tiny real request; one that failed it is not up.

    An engine can be healthy and fail every request (a hybrid model in float32 on the CPU): this says so at
    start, with the fix, instead of the first keyframe's 500.
    """
    slots = {slot.url: slot for slot in engines.engines}
    outcomes = await asyncio.gather(*(
        first_request.check(slots[engine["url"]].client, engine["health"]) for engine in readiness
    ))
    for engine, outcome in zip(readiness, outcomes, strict=True):
        if outcome is not None and outcome.status == "failed":
            engine["up"] = False
            engine["first_request"] = {"status": outcome.status, "detail": outcome.detail}


@get("/metrics", media_type="text/plain; version=0.0.4")  # Litestar adds "; charset=utf-8" to text types
async def metrics(
    metrics: NamedDependency[GatewayMetrics], admission: NamedDependency[AdmissionQueue],
    review: NamedDependency[ReviewQueue],
) -> bytes:
    """Prometheus text format."""
    metrics.admission_now(admission.inflight, admission.queued)
    # The review queue's gauges, read now; Redis down or slow: they keep their last values (a scrape must
    # not wait out the Redis client's socket timeout).
    with contextlib.suppress(StateUnavailable, TimeoutError):
        async with asyncio.timeout(_REVIEW_READ_S):
            await review.queues()
    return generate_latest(metrics.registry)


@get("/stats")
async def stats(
    recent: NamedDependency[RecentRequests], engine_cache: NamedDependency[EngineCacheScraper],
    admission: NamedDependency[AdmissionQueue], policies: NamedDependency[PolicyStore],
    settings: NamedDependency[Settings], tenants: NamedDependency[TenantFigures],
) -> dict[str, Any]:
    """Latency percentiles, keyframes per minute, thinking share and cache rates over the recent window."""
    document = stats_document(recent, engine_cache)
    document["inflight"] = admission.inflight
    document["queued"] = admission.queued
    document["thinking_default"] = policies.current().default_mode
    document["fairness"] = settings.admission.fairness
    document["tenants"] = tenants.rows()  # per tenant: share, quotas, latency, queue wait
    return document


ROUTES = [healthz, readyz, metrics, stats]
