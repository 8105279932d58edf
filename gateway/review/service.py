"""The review queue as the gateway uses it: what the moderation path offers, and the reviewers' calls."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from prometheus_client import CollectorRegistry

from gateway.errors import Forbidden, NotFound, StateUnavailable
from gateway.review.models import Label, LabelledItem, QueuedItem, ReviewItem, TenantQueue, new_item_id
from gateway.review.selection import UnitRandom, review_reason
from gateway.review.store import ReviewStore
from gateway.series.review import ReviewMetrics
from gateway.settings import ReviewSettings
from gateway.tasks import together
from shaping.verdict import Action, KeyframeVerdict

if TYPE_CHECKING:
    from gateway.caller import Caller

    # a frame's outcome is the moderation path's: it hands one in (offer) and the queue reads its fields only
    from gateway.moderation.outcome import FrameOutcome
    from gateway.policy.moderation import TenantModeration
    from gateway.wire import ModerationResult
    from shaping.image import ShapedImage

log = logging.getLogger("modgate.review")


@dataclass(frozen=True, slots=True)
class Reviewer:
    """Who labels: a name for the claims and the audit trail, and the tenants they may see (None: all)."""

    name: str
    tenants: frozenset[str] | None = None


class ReviewQueue:
    """Offers verdicts to the queue (by :func:`review_reason`), and answers the reviewers' calls."""

    def __init__(
        self,
        store: ReviewStore,
        settings: ReviewSettings,
        *,
        metrics: ReviewMetrics | None = None,
        rng: UnitRandom | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics or ReviewMetrics(CollectorRegistry(), settings.oldest_alert_s)
        self.rng = rng or random.Random()
        self.clock = clock
        # What a label changes elsewhere (the job's result and webhook), set by open_services.
        self.on_label: Callable[[LabelledItem], Awaitable[None]] | None = None

    async def offer(
        self,
        tenant: str,
        frame: str | ShapedImage,
        verdict: KeyframeVerdict,
        thinking: Literal["on", "off"],
        reasoning: str | None,
        request_id: str,
        *,
        model: str = "",
        job_id: str | None = None,
        frame_sha256: str | None = None,
        decision_id: str | None = None,
        moderation_request_id: str | None = None,
        tenant_review_below: float = 0.0,
        tenant_audit_sample_rate: float = 0.0,
    ) -> ReviewItem | None:
        """Queue the frame if its verdict should be seen by people; never fails the moderation it came from
        (an unreachable Redis is logged and counted, the verdict still goes back). The tenant's moderation
        policy may raise the gateway's review threshold and audit rate for its frames, never lower them.
        ``frame``: its data URL, or the shaped frame (its URL, an image-sized string, made only if queued)."""
        settings = self.settings
        if not settings.enabled:
            return None
        review_below = max(settings.review_below, tenant_review_below)
        audit_sample_rate = max(settings.audit_sample_rate, tenant_audit_sample_rate)
        reason = review_reason(verdict.action, verdict.confidence, review_below, audit_sample_rate, self.rng)
        if reason is None:
            return None
        item = ReviewItem(
            id=new_item_id(),
            tenant=tenant,
            frame=frame if isinstance(frame, str) else frame.data_url,
            action=verdict.action,
            categories=verdict.categories,
            confidence=verdict.confidence,
            reason=reason,
            audit_sample_rate=audit_sample_rate,
            thinking=thinking,
            reasoning=reasoning if thinking == "on" else None,
            request_id=request_id,
            enqueued_at=self.clock(),
            model=model,
            job_id=job_id,
            frame_sha256=frame_sha256,
            decision_id=decision_id,
            moderation_request_id=moderation_request_id,
        )
        twice = reason == "audit" and self.rng.random() < settings.double_label_share
        try:
            held = await self.store.enqueue(item)
            if twice:  # a second item of the same decision, for a second reviewer's label
                held = await self.store.enqueue(replace(item, id=new_item_id())) and held
        except StateUnavailable as exc:
            self.metrics.not_queued()
            log.error("frame of %s not queued for review: %s", request_id, exc)
            return None
        if not held:
            self.metrics.not_replicated()
            log.warning("frame of %s queued for review on the Redis primary, not yet on a replica (a "
                        "failover now would lose it)", request_id)
        self.metrics.queued(tenant, reason, 2 if twice else 1)
        return item

    async def claim(self, reviewer: Reviewer) -> ReviewItem | None:
        """The reviewer's next item, from the tenants they may see."""
        return await self.store.claim(reviewer.name, reviewer.tenants)

    async def look(self, item_id: str, reviewer: Reviewer) -> QueuedItem:
        """An item still queued, with its frame and holder, claiming nothing: 404 once it is labelled or
        expired (or never was), 403 when it is a tenant's the reviewer may not see."""
        found = await self.store.peek(item_id)
        if found is None:
            raise NotFound(f"review item {item_id} is not in the queue: labelled, expired or never queued",
                           code="review_item_gone")
        if reviewer.tenants is not None and found.item.tenant not in reviewer.tenants:
            raise Forbidden(f"review item {item_id} is another tenant's: you do not review it",
                            code="review_item_other_tenant")
        return found

    async def label(
        self, item_id: str, reviewer: Reviewer, action: Action, categories: Collection[str]
    ) -> LabelledItem:
        """Record a held item's label (409 when labelled, gone, someone else's, or of a tenant the reviewer
        may not see; audited in the store with the reviewer's name), then what it changes elsewhere: a
        failure there is logged, the label stands."""
        label = Label(action, tuple(categories) if action == "block" else (), reviewer.name, self.clock())
        done = await self.store.label(item_id, label, reviewer.tenants)
        self.metrics.labelled(done.item.tenant, done.agrees)
        if self.on_label is not None:
            try:
                await self.on_label(done)
            except StateUnavailable as exc:
                log.error("review item %s labelled, but its job was not updated: %s", item_id, exc)
        return done

    async def skip(self, item_id: str, reviewer: Reviewer) -> None:
        """Give a held item back for someone else."""
        await self.store.release(item_id, reviewer.name, reviewer.tenants)

    async def audit(self, limit: int, reviewer: Reviewer | None = None) -> list[dict[str, Any]]:
        """The labels' audit trail, newest first (only the reviewer's tenants, when scoped)."""
        entries = await self.store.audit(limit)
        scope = None if reviewer is None else reviewer.tenants
        return [entry for entry in entries if scope is None or entry.get("tenant") in scope]

    async def queues(self, reviewer: Reviewer | None = None) -> dict[str, TenantQueue]:
        """Depth, claimed and oldest age per tenant (only the reviewer's tenants, when given)."""
        figures = await self.store.queues()
        if reviewer is None or reviewer.tenants is None:
            self.metrics.show(figures)
        scope = None if reviewer is None else reviewer.tenants
        return {t: q for t, q in sorted(figures.items()) if scope is None or t in scope}

    async def offer_judged(
        self,
        caller: Caller,
        frames: list[ShapedImage],
        outcomes: list[FrameOutcome],
        results: list[ModerationResult],
        tenant: TenantModeration | None = None,
        moderation_request_id: str | None = None,
    ) -> list[ReviewItem | None]:
        """Offer each answered frame, reused verdicts too (a reused verdict is a decision of its own, and
        the audit sample stands for every confident decision); :func:`review_reason` decides which go, with
        the tenant's policy's threshold and audit rate. Returns each frame's item (None: not queued)."""
        return await together(*(
            self.offer(
                caller.tenant, frame, outcome.verdict, result.modgate.thinking,
                outcome.answer.reasoning, result.modgate.request_id, job_id=caller.job_id,
                frame_sha256=result.modgate.frame_sha256, decision_id=result.modgate.decision_id,
                moderation_request_id=moderation_request_id,
                tenant_review_below=tenant.review_below if tenant else 0.0,
                tenant_audit_sample_rate=tenant.audit_sample_rate if tenant else 0.0,
            )
            for frame, outcome, result in zip(frames, outcomes, results, strict=True)
        ))
