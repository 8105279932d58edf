"""The contract every review store keeps (in memory, or Redis streams)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from gateway.review.models import Label, LabelledItem, QueuedItem, ReviewItem, TenantQueue


class ReviewStore(Protocol):
    """Where review items wait, who holds them, and their labels."""

    durable: bool

    async def enqueue(self, item: ReviewItem) -> bool:
        """Queue an item at its tenant's end; its frame is kept until labelled or ``retention_s``. False when
        it is queued but not yet on the replicas the store waits for (a failover now would lose it)."""
        ...

    async def claim(self, reviewer: str, tenants: Collection[str] | None) -> ReviewItem | None:
        """The next item for ``reviewer`` (a claim older than the timeout first, else a new one) from
        ``tenants`` (None: every tenant), now held by this reviewer; None when none waits."""
        ...

    async def peek(self, item_id: str) -> QueuedItem | None:
        """The item, its frame and holder, claiming nothing; None once labelled, expired or unknown."""
        ...

    async def label(
        self, item_id: str, label: Label, tenants: Collection[str] | None = None
    ) -> LabelledItem:
        """Record the label of an item ``label.reviewer`` holds and drop its frame; :class:`ReviewConflict`
        when it is labelled already, gone, or held by someone else (or no one). An item of a tenant outside
        ``tenants`` (None: every tenant) is gone for this reviewer, even one they hold."""
        ...

    async def release(self, item_id: str, reviewer: str, tenants: Collection[str] | None = None) -> None:
        """Give a held item back to its tenant's queue (a skip): at the end, for any reviewer (``tenants``:
        as for :meth:`label`)."""
        ...

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        """The labels' audit trail (:func:`gateway.review.models.audit_entry`), newest first."""
        ...

    async def queues(self) -> dict[str, TenantQueue]:
        """Every tenant's depth, claimed count and oldest age (expired items dropped first)."""
        ...
