"""Review items in one process's memory: the same contract as Redis, NOT durable (a restart loses them)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from gateway.review.models import (
    Label,
    LabelledItem,
    QueuedItem,
    ReviewConflict,
    ReviewItem,
    TenantQueue,
    audit_entry,
)


@dataclass(slots=True)
class _Held:
    item: ReviewItem
    order: int  # position in its tenant's queue (a skip moves it to the end)
    reviewer: str | None = None
    claimed_at: float = 0.0


class MemoryReviewStore:
    """Review items in this process only: NOT durable."""

    durable = False

    def __init__(
        self,
        *,
        claim_timeout_s: float,
        retention_s: float,
        audit_max_entries: int = 10_000,
        max_items: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.claim_timeout_s = claim_timeout_s
        self.retention_s = retention_s
        self._clock = clock
        self._items: dict[str, _Held] = {}
        self._labelled: dict[str, float] = {}  # item id → when its tombstone expires
        # decision → reviewer → (the item of it they were handed, until when that is remembered): a
        # double-labelled decision's second item never goes to the reviewer who had its first
        self._handed: dict[str, dict[str, tuple[str, float]]] = {}
        self._next = 0
        self.max_items = max_items  # each holds a shaped frame (~100 KB): the oldest go first past this
        self._audit: list[dict[str, Any]] = []  # newest first, at most ``audit_max_entries``
        self.audit_max_entries = audit_max_entries

    def _expire(self) -> None:
        now = self._clock()
        for item_id in [i for i, h in self._items.items() if h.item.enqueued_at + self.retention_s <= now]:
            del self._items[item_id]
        for item_id in [i for i, until in self._labelled.items() if until <= now]:
            del self._labelled[item_id]
        for decision in [d for d, by in self._handed.items() if all(t <= now for _, t in by.values())]:
            del self._handed[decision]

    def _theirs_already(self, held: _Held, reviewer: str) -> bool:
        """Whether ``reviewer`` was handed another item of this item's decision (they hold or labelled it)."""
        had = self._handed.get(held.item.decision_key, {}).get(reviewer)
        return had is not None and had[0] != held.item.id

    async def enqueue(self, item: ReviewItem) -> bool:
        """Queue the item at its tenant's end (this process's memory has no replica to wait for)."""
        self._next += 1
        self._items[item.id] = _Held(item, self._next)
        if len(self._items) > self.max_items:
            del self._items[min(self._items.values(), key=lambda h: h.order).item.id]
        return True

    async def claim(self, reviewer: str, tenants: Collection[str] | None) -> ReviewItem | None:
        """A timed-out claim first, then the oldest unclaimed item, across the reviewer's tenants; never an
        item of a decision the reviewer was handed another item of (None when only such items wait)."""
        self._expire()
        now = self._clock()
        visible = [h for h in self._items.values() if (tenants is None or h.item.tenant in tenants)
                   and not self._theirs_already(h, reviewer)]
        stale = [h for h in visible if h.reviewer is not None and now - h.claimed_at >= self.claim_timeout_s]
        fresh = [h for h in visible if h.reviewer is None]
        for candidates in (stale, fresh):
            if candidates:
                held = min(candidates, key=lambda h: h.order)
                held.reviewer, held.claimed_at = reviewer, now
                handed = self._handed.setdefault(held.item.decision_key, {})
                handed[reviewer] = (held.item.id, now + self.retention_s)
                return held.item
        return None

    async def peek(self, item_id: str) -> QueuedItem | None:
        """The item and its holder, claiming nothing."""
        self._expire()
        held = self._items.get(item_id)
        return None if held is None else QueuedItem(held.item, held.reviewer)

    def _held_by(self, item_id: str, reviewer: str, tenants: Collection[str] | None) -> _Held:
        self._expire()
        if item_id in self._labelled:
            raise ReviewConflict(item_id, "labelled")
        held = self._items.get(item_id)
        if held is None or (tenants is not None and held.item.tenant not in tenants):
            raise ReviewConflict(item_id, "gone")
        if held.reviewer is None:
            raise ReviewConflict(item_id, "unclaimed")
        if held.reviewer != reviewer:
            raise ReviewConflict(item_id, "claimed")
        return held

    async def label(
        self, item_id: str, label: Label, tenants: Collection[str] | None = None
    ) -> LabelledItem:
        """Record the label; the frame goes with the item."""
        held = self._held_by(item_id, label.reviewer, tenants)
        del self._items[item_id]
        self._labelled[item_id] = self._clock() + self.retention_s
        item = replace(held.item, frame="")
        self._audit.insert(0, audit_entry(item, label))
        del self._audit[self.audit_max_entries:]
        return LabelledItem(item, label)

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        """The labels, newest first."""
        return self._audit[:limit]

    async def release(self, item_id: str, reviewer: str, tenants: Collection[str] | None = None) -> None:
        """Back to the end of its tenant's queue, unclaimed."""
        held = self._held_by(item_id, reviewer, tenants)
        self._next += 1
        held.order, held.reviewer, held.claimed_at = self._next, None, 0.0

    async def queues(self) -> dict[str, TenantQueue]:
        """Depth, claimed and oldest age per tenant with items."""
        self._expire()
        now = self._clock()
        figures: dict[str, TenantQueue] = {}
        for held in self._items.values():
            tenant = held.item.tenant
            known = figures.get(tenant, TenantQueue(0, 0, None))
            age = now - held.item.enqueued_at
            figures[tenant] = TenantQueue(
                known.depth + 1,
                known.claimed + (held.reviewer is not None),
                age if known.oldest_age_s is None else max(age, known.oldest_age_s),
            )
        return figures
