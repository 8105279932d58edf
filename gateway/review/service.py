"""The review queue as the gateway uses it: what the moderation path offers, and the reviewers' calls."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

from gateway.errors import StateUnavailable
from gateway.review.models import Label, LabelledItem, ReviewItem, TenantQueue, new_item_id
from gateway.review.selection import UnitRandom, review_reason
from gateway.review.store import ReviewStore
from gateway.settings import ReviewSettings
from shaping.verdict import Action, KeyframeVerdict

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
        rng: UnitRandom | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.rng = rng or random.Random()
        self.clock = clock
        self.enqueue_failures = 0  # frames that should have been queued but Redis refused (logged)

    async def offer(
        self,
        tenant: str,
        frame: str,
        verdict: KeyframeVerdict,
        thinking: Literal["on", "off"],
        reasoning: str | None,
        request_id: str,
        *,
        model: str = "",
        job_id: str | None = None,
    ) -> ReviewItem | None:
        """Queue the frame if its verdict should be seen by people; never fails the moderation it came from
        (an unreachable Redis is logged and counted, the verdict still goes back)."""
        settings = self.settings
        if not settings.enabled:
            return None
        reason = review_reason(
            verdict.action, verdict.confidence, settings.review_below, settings.audit_sample_rate, self.rng
        )
        if reason is None:
            return None
        item = ReviewItem(
            id=new_item_id(),
            tenant=tenant,
            frame=frame,
            action=verdict.action,
            categories=verdict.categories,
            confidence=verdict.confidence,
            reason=reason,
            audit_sample_rate=settings.audit_sample_rate,
            thinking=thinking,
            reasoning=reasoning if thinking == "on" else None,
            request_id=request_id,
            enqueued_at=self.clock(),
            model=model,
            job_id=job_id,
        )
        try:
            await self.store.enqueue(item)
        except StateUnavailable as exc:
            self.enqueue_failures += 1
            log.error("frame of %s not queued for review: %s", request_id, exc)
            return None
        return item

    async def claim(self, reviewer: Reviewer) -> ReviewItem | None:
        """The reviewer's next item, from the tenants they may see."""
        return await self.store.claim(reviewer.name, reviewer.tenants)

    async def label(
        self, item_id: str, reviewer: Reviewer, action: Action, categories: Collection[str]
    ) -> LabelledItem:
        """Record a held item's label (409 when labelled, gone, or someone else's)."""
        label = Label(action, tuple(categories) if action == "block" else (), reviewer.name, self.clock())
        return await self.store.label(item_id, label)

    async def skip(self, item_id: str, reviewer: Reviewer) -> None:
        """Give a held item back for someone else."""
        await self.store.release(item_id, reviewer.name)

    async def queues(self, reviewer: Reviewer | None = None) -> dict[str, TenantQueue]:
        """Depth, claimed and oldest age per tenant (only the reviewer's tenants, when given)."""
        figures = await self.store.queues()
        scope = None if reviewer is None else reviewer.tenants
        return {t: q for t, q in sorted(figures.items()) if scope is None or t in scope}
