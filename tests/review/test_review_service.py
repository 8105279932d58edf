"""What the moderation path hands the queue: a store that cannot be written never fails the verdict."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import Forbidden, NotFound, StateUnavailable
from gateway.review.models import Label, LabelledItem, QueuedItem, ReviewConflict, ReviewItem, TenantQueue
from gateway.review.service import Reviewer, ReviewQueue
from gateway.review.store_memory import MemoryReviewStore
from gateway.series.review import ReviewMetrics
from gateway.settings import ReviewSettings
from shaping.verdict import KeyframeVerdict


class RedisDown:
    """A store whose every call fails as an unreachable Redis does."""

    durable = True

    async def enqueue(self, item: ReviewItem) -> None:
        raise StateUnavailable("Redis is unreachable")

    async def claim(self, reviewer: str, tenants: Collection[str] | None) -> ReviewItem | None:
        raise StateUnavailable("Redis is unreachable")

    async def peek(self, item_id: str) -> QueuedItem | None:
        raise StateUnavailable("Redis is unreachable")

    async def label(self, item_id: str, label: Label, tenants: Collection[str] | None = None) -> LabelledItem:
        raise StateUnavailable("Redis is unreachable")

    async def release(self, item_id: str, reviewer: str, tenants: Collection[str] | None = None) -> None:
        raise StateUnavailable("Redis is unreachable")

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        raise StateUnavailable("Redis is unreachable")

    async def queues(self) -> dict[str, TenantQueue]:
        raise StateUnavailable("Redis is unreachable")


def counter(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_an_unwritable_queue_leaves_the_verdict_alone_and_is_counted() -> None:
    registry = CollectorRegistry()
    queue = ReviewQueue(RedisDown(), ReviewSettings(), metrics=ReviewMetrics(registry, 3600))
    offered = await queue.offer("a", "data:image/jpeg;base64,AAAA", KeyframeVerdict("review"), "off", None,
                                "modr-1-0")
    assert offered is None
    assert counter(registry, "modgate_review_enqueue_failures_total") == 1
    with pytest.raises(StateUnavailable):  # a reviewer's call says it: 503
        await queue.claim(Reviewer("alice"))


async def test_reasoning_is_kept_only_when_thinking_was_on() -> None:
    registry = CollectorRegistry()
    store = MemoryReviewStore(claim_timeout_s=60, retention_s=3600)
    queue = ReviewQueue(store, ReviewSettings(), metrics=ReviewMetrics(registry, 3600))
    on = await queue.offer("a", "data:,", KeyframeVerdict("review"), "on", "looks like a weapon", "r-0")
    off = await queue.offer("a", "data:,", KeyframeVerdict("review"), "off", "stray text", "r-1")
    allowed = await queue.offer("a", "data:,", KeyframeVerdict("allow", confidence=0.99), "off", None, "r-2")
    assert on is not None
    assert off is not None
    assert (on.reasoning, off.reasoning, allowed) == ("looks like a weapon", None, None)
    assert counter(registry, "modgate_review_enqueued_total", tenant="a", reason="review") == 2


async def test_a_scoped_reviewer_sees_only_their_tenants_queue() -> None:
    store = MemoryReviewStore(claim_timeout_s=60, retention_s=3600)
    queue = ReviewQueue(store, ReviewSettings())
    for tenant in ("a", "b"):
        await queue.offer(tenant, "data:,", KeyframeVerdict("review"), "off", None, f"r-{tenant}")
    scoped = Reviewer("alice", frozenset({"a"}))
    assert list(await queue.queues(scoped)) == ["a"]
    claimed = await queue.claim(scoped)
    assert claimed is not None
    assert claimed.tenant == "a"
    assert await queue.claim(scoped) is None


async def test_a_scoped_reviewer_may_look_at_their_tenants_items_only() -> None:
    """What the console's frame route serves: the frame of an item of a tenant the reviewer reviews."""
    queue = ReviewQueue(MemoryReviewStore(claim_timeout_s=60, retention_s=3600), ReviewSettings())
    mine, theirs = [
        await queue.offer(tenant, f"data:image/png;base64,{tenant.upper()}AAA", KeyframeVerdict("review"),
                          "off", None, f"r-{tenant}")
        for tenant in ("a", "b")
    ]
    assert mine is not None
    assert theirs is not None
    scoped = Reviewer("alice", frozenset({"a"}))
    seen = await queue.look(mine.id, scoped)
    assert (seen.item.frame, seen.holder) == ("data:image/png;base64,AAAA", None)
    with pytest.raises(Forbidden) as refused:
        await queue.look(theirs.id, scoped)
    assert (refused.value.status, refused.value.code) == (403, "review_item_other_tenant")
    assert (await queue.look(theirs.id, Reviewer("root"))).item.tenant == "b"  # every tenant's reviewer
    with pytest.raises(NotFound):
        await queue.look("rev-00000000000000000000000000000000", scoped)


async def test_a_reviewer_labels_only_items_of_the_tenants_they_review_now() -> None:
    """Claimed as a reviewer of a; signed in again as a reviewer of b only (same name): not theirs now."""
    queue = ReviewQueue(MemoryReviewStore(claim_timeout_s=60, retention_s=3600), ReviewSettings())
    await queue.offer("a", "data:,", KeyframeVerdict("review"), "off", None, "r-a")
    claimed = await queue.claim(Reviewer("rita", frozenset({"a"})))
    assert claimed is not None
    moved = Reviewer("rita", frozenset({"b"}))
    with pytest.raises(ReviewConflict, match="not in the queue"):
        await queue.label(claimed.id, moved, "allow", [])
    with pytest.raises(ReviewConflict, match="not in the queue"):
        await queue.skip(claimed.id, moved)
    assert await queue.audit(10) == []


async def test_a_double_labelled_audit_sample_is_queued_twice_for_two_reviewers_of_one_decision() -> None:
    store = MemoryReviewStore(claim_timeout_s=60, retention_s=3600)
    settings = ReviewSettings(audit_sample_rate=1.0, double_label_share=1.0)
    queue = ReviewQueue(store, settings, metrics=ReviewMetrics(CollectorRegistry(), 3600))
    sure = KeyframeVerdict("allow", confidence=0.99)
    offered = await queue.offer("a", "data:,", sure, "off", None, "r-0", decision_id="dec-1")
    unqueued_twice = await queue.offer("a", "data:,", KeyframeVerdict("review"), "off", None, "r-1",
                                       decision_id="dec-2")
    assert offered is not None
    assert unqueued_twice is not None
    first = await queue.claim(Reviewer("alice"))
    second = await queue.claim(Reviewer("bob"))
    third = await queue.claim(Reviewer("carol"))
    assert first is not None
    assert second is not None
    assert third is not None
    assert (first.decision_id, second.decision_id, third.decision_id) == ("dec-1", "dec-1", "dec-2")
    assert first.id != second.id
    assert await queue.claim(Reviewer("dave")) is None  # a review verdict is queued once
    await queue.label(first.id, Reviewer("alice"), "allow", [])
    done = await queue.label(second.id, Reviewer("bob"), "block", ["violence"])
    assert done.item.decision_id == "dec-1"


async def test_one_reviewer_alone_is_never_handed_both_items_of_a_double_labelled_decision() -> None:
    store = MemoryReviewStore(claim_timeout_s=60, retention_s=3600)
    settings = ReviewSettings(audit_sample_rate=1.0, double_label_share=1.0)
    queue = ReviewQueue(store, settings, metrics=ReviewMetrics(CollectorRegistry(), 3600))
    await queue.offer("a", "data:,", KeyframeVerdict("allow", confidence=0.99), "off", None, "r-0",
                      decision_id="dec-1")
    alice = Reviewer("alice")
    first = await queue.claim(alice)
    assert first is not None
    await queue.label(first.id, alice, "allow", [])
    assert await queue.claim(alice) is None  # only her own decision's second item waits: nothing for her
    second = await queue.claim(Reviewer("bob"))
    assert second is not None
    assert second.decision_id == "dec-1"
