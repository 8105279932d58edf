"""Both review stores keep one contract: per tenant, one reviewer per item, a timed-out claim goes back,
a label once, the frame gone with the item."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.review.models import Label, ReviewConflict, ReviewItem, new_item_id
from gateway.review.store import ReviewStore
from gateway.review.store_memory import MemoryReviewStore
from gateway.review.store_redis import RedisReviewStore

CLAIM_TIMEOUT_S = 0.3


class Clock:
    """Seconds, moved by hand (the memory store's claim timeout and retention)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def item(tenant: str, n: int = 0, **fields: Any) -> ReviewItem:
    values: dict[str, Any] = {
        "id": new_item_id(), "tenant": tenant, "frame": f"data:image/jpeg;base64,AAA{n}",
        "action": "review", "categories": (), "confidence": 0.4, "reason": "review",
        "audit_sample_rate": 0.0, "thinking": "off", "reasoning": None, "request_id": f"modr-{n}",
        "enqueued_at": 0.0,
    }
    return ReviewItem(**{**values, **fields})


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ReviewStore, Clock]]:
    clock = Clock()
    if request.param == "memory":
        yield MemoryReviewStore(claim_timeout_s=CLAIM_TIMEOUT_S, retention_s=3600, clock=clock), clock
        return
    redis_url: str = request.getfixturevalue("redis_url")
    client = aioredis.Redis.from_url(redis_url)
    yield RedisReviewStore(client, claim_timeout_s=CLAIM_TIMEOUT_S, retention_s=3600), clock
    await client.aclose()


async def pass_claim_timeout(store: ReviewStore, clock: Clock) -> None:
    """Memory moves its clock; Redis measures a claim's idle time itself, so wait it out for real."""
    clock.now += CLAIM_TIMEOUT_S + 0.1
    if isinstance(store, RedisReviewStore):
        await asyncio.sleep(CLAIM_TIMEOUT_S + 0.1)


def label(reviewer: str, action: Any = "allow", categories: tuple[str, ...] = ()) -> Label:
    return Label(action, categories, reviewer, 0.0)


async def test_each_item_goes_to_one_reviewer(store: tuple[ReviewStore, Clock]) -> None:
    queue, _ = store
    first, second = item("a", 1, enqueued_at=Clock().now), item("a", 2, enqueued_at=Clock().now)
    await queue.enqueue(first)
    await queue.enqueue(second)
    got = [await queue.claim("alice", None), await queue.claim("bob", None), await queue.claim("carol", None)]
    assert [g.id if g else None for g in got] == [first.id, second.id, None]
    assert got[0] is not None
    assert got[0].frame == first.frame


async def test_a_reviewer_of_one_tenant_never_gets_anothers_frame(store: tuple[ReviewStore, Clock]) -> None:
    queue, _ = store
    await queue.enqueue(item("b", 1, enqueued_at=Clock().now))
    assert await queue.claim("alice", {"a"}) is None
    mine = item("a", 2, enqueued_at=Clock().now)
    await queue.enqueue(mine)
    got = await queue.claim("alice", {"a"})
    assert got is not None
    assert got.id == mine.id
    assert got.tenant == "a"


async def test_a_reviewer_whose_tenants_changed_cannot_label_or_skip_an_item_they_hold(
    store: tuple[ReviewStore, Clock],
) -> None:
    """Held under tenant a, then the reviewer's tenants became {b} (their roles changed at the provider and
    they signed in again): the item is gone for them, even though their name still holds it."""
    queue, _ = store
    queued = item("a", 1, enqueued_at=Clock().now)
    await queue.enqueue(queued)
    assert await queue.claim("rita", {"a"}) is not None
    with pytest.raises(ReviewConflict) as labelled:
        await queue.label(queued.id, label("rita"), {"b"})
    assert labelled.value.kind == "gone"
    with pytest.raises(ReviewConflict) as skipped:
        await queue.release(queued.id, "rita", {"b"})
    assert skipped.value.kind == "gone"
    assert await queue.audit(10) == []
    done = await queue.label(queued.id, label("rita"), {"a"})  # under tenant a again: theirs to label
    assert done.item.tenant == "a"


async def test_a_label_is_taken_once_and_drops_the_frame(store: tuple[ReviewStore, Clock]) -> None:
    queue, _ = store
    queued = item("a", 1, action="block", categories=("violence",), enqueued_at=Clock().now)
    await queue.enqueue(queued)
    await queue.claim("alice", None)
    done = await queue.label(queued.id, label("alice", "allow"))
    assert (done.item.id, done.item.action, done.item.categories, done.item.frame) == (
        queued.id, "block", ("violence",), ""
    )
    assert not done.agrees
    with pytest.raises(ReviewConflict) as again:
        await queue.label(queued.id, label("alice"))
    assert (again.value.status, again.value.code) == (409, "review_item_labelled")
    assert await queue.queues() == {}


async def test_a_label_by_someone_not_holding_the_item_is_refused(store: tuple[ReviewStore, Clock]) -> None:
    queue, _ = store
    queued = item("a", 1, enqueued_at=Clock().now)
    await queue.enqueue(queued)
    with pytest.raises(ReviewConflict) as unclaimed:
        await queue.label(queued.id, label("alice"))
    assert unclaimed.value.kind == "unclaimed"
    await queue.claim("alice", None)
    with pytest.raises(ReviewConflict) as other:
        await queue.label(queued.id, label("bob"))
    assert (other.value.kind, other.value.code) == ("claimed", "review_item_claimed")
    with pytest.raises(ReviewConflict) as unknown:
        await queue.label(new_item_id(), label("alice"))
    assert unknown.value.kind == "gone"


async def test_a_claim_that_times_out_returns_to_the_queue(store: tuple[ReviewStore, Clock]) -> None:
    queue, clock = store
    queued = item("a", 1, enqueued_at=Clock().now)
    await queue.enqueue(queued)
    assert (await queue.claim("alice", None)) is not None
    assert await queue.claim("bob", None) is None  # held, not timed out yet
    await pass_claim_timeout(queue, clock)
    taken = await queue.claim("bob", None)
    assert taken is not None
    assert taken.id == queued.id
    with pytest.raises(ReviewConflict) as late:  # alice's claim moved to bob
        await queue.label(queued.id, label("alice"))
    assert late.value.kind == "claimed"
    assert (await queue.label(queued.id, label("bob"))).label.reviewer == "bob"


async def test_a_skip_gives_the_item_back(store: tuple[ReviewStore, Clock]) -> None:
    queue, _ = store
    first, second = item("a", 1, enqueued_at=Clock().now), item("a", 2, enqueued_at=Clock().now)
    await queue.enqueue(first)
    await queue.enqueue(second)
    assert (await queue.claim("alice", None)) is not None
    await queue.release(first.id, "alice")
    order = [await queue.claim("bob", None), await queue.claim("bob", None)]
    assert [g.id if g else None for g in order] == [second.id, first.id]  # back at the end


async def test_the_queue_reports_depth_claims_and_age_per_tenant(store: tuple[ReviewStore, Clock]) -> None:
    queue, clock = store
    for n in range(3):
        await queue.enqueue(item("a", n, enqueued_at=clock.now))
    await queue.enqueue(item("b", 9, enqueued_at=clock.now))
    await queue.claim("alice", {"a"})
    figures = await queue.queues()
    assert {t: (q.depth, q.claimed) for t, q in figures.items()} == {"a": (3, 1), "b": (1, 0)}
    assert all(q.oldest_age_s is not None and q.oldest_age_s >= 0 for q in figures.values())


@pytest.mark.redis
async def test_an_expired_item_is_skipped_and_never_served(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    queue = RedisReviewStore(client, claim_timeout_s=60, retention_s=3600)
    gone, kept = item("a", 1), item("a", 2)
    await queue.enqueue(gone)
    await queue.enqueue(kept)
    await client.delete(RedisReviewStore.item_key(gone.id))  # as its TTL would
    got = await queue.claim("alice", None)
    assert got is not None
    assert got.id == kept.id
    assert await queue.claim("alice", None) is None
    with pytest.raises(ReviewConflict) as late:
        await queue.label(gone.id, label("alice"))
    assert late.value.kind == "gone"
    await client.aclose()


def test_an_item_expires_after_the_retention_in_memory() -> None:
    clock = Clock()
    queue = MemoryReviewStore(claim_timeout_s=60, retention_s=100, clock=clock)
    queued = item("a", 1, enqueued_at=clock.now)

    async def run() -> None:
        await queue.enqueue(queued)
        clock.now += 101
        assert await queue.claim("alice", None) is None
        assert await queue.queues() == {}

    asyncio.run(run())


def test_memory_keeps_at_most_its_item_cap_dropping_the_oldest() -> None:
    clock = Clock()
    queue = MemoryReviewStore(claim_timeout_s=60, retention_s=3600, max_items=2, clock=clock)
    items = [item("a", n, enqueued_at=clock.now) for n in range(3)]

    async def run() -> list[str | None]:
        for queued in items:
            await queue.enqueue(queued)
        claims = [await queue.claim("alice", None) for _ in range(3)]
        return [c.id if c else None for c in claims]

    assert asyncio.run(run()) == [items[1].id, items[2].id, None]


async def test_a_peek_shows_the_item_and_its_holder_and_claims_nothing(
    store: tuple[ReviewStore, Clock],
) -> None:
    queue, _ = store
    queued = item("a", 1, enqueued_at=Clock().now)
    await queue.enqueue(queued)
    waiting = await queue.peek(queued.id)
    assert waiting is not None
    assert (waiting.item, waiting.holder) == (queued, None)
    claimed = await queue.claim("alice", None)
    assert claimed is not None
    assert claimed.id == queued.id  # the peek did not take it
    held = await queue.peek(queued.id)
    assert held is not None
    assert (held.item.frame, held.holder) == (queued.frame, "alice")
    await queue.label(queued.id, label("alice"))
    assert await queue.peek(queued.id) is None  # labelled: the frame is gone
    assert await queue.peek(new_item_id()) is None


def twins(tenant: str, n: int) -> tuple[ReviewItem, ReviewItem]:
    """A double-labelled decision's two items (the second reviewer's is a copy with its own id)."""
    first = item(tenant, n, enqueued_at=Clock().now, decision_id=f"dec-{n}", reason="audit")
    return first, dataclasses.replace(first, id=new_item_id())


async def test_a_reviewer_holding_a_decision_is_told_there_is_nothing_when_only_its_twin_waits(
    store: tuple[ReviewStore, Clock],
) -> None:
    queue, _ = store
    first, second = twins("a", 1)
    await queue.enqueue(first)
    await queue.enqueue(second)
    held = await queue.claim("alice", None)
    assert held is not None
    assert held.id == first.id
    assert await queue.claim("alice", None) is None  # only her own decision's twin waits
    passed_over = await queue.peek(second.id)
    assert passed_over is not None
    assert passed_over.holder is None  # held by no one: waiting for another
    assert (await queue.queues())["a"].claimed == 1
    with pytest.raises(ReviewConflict) as refused:
        await queue.label(second.id, label("bob"))
    assert refused.value.kind == "unclaimed"
    other = await queue.claim("bob", None)
    assert other is not None
    assert other.id == second.id  # the second reviewer is another person


async def test_a_reviewer_who_labelled_a_decision_never_gets_its_twin(
    store: tuple[ReviewStore, Clock],
) -> None:
    queue, _ = store
    first, second = twins("a", 1)
    later = item("a", 2, enqueued_at=Clock().now)
    await queue.enqueue(first)
    await queue.enqueue(second)
    await queue.enqueue(later)
    assert (await queue.claim("alice", None)) == first
    await queue.label(first.id, label("alice"))
    got = await queue.claim("alice", None)
    assert got is not None
    assert got.id == later.id  # past her twin, to the next decision
    assert await queue.claim("alice", None) is None
    bobs = await queue.claim("bob", None)
    assert bobs is not None
    assert bobs.id == second.id
    assert await queue.claim("carol", None) is None


async def test_a_twin_whose_reviewer_timed_out_is_not_handed_to_the_holder_of_the_other(
    store: tuple[ReviewStore, Clock],
) -> None:
    queue, clock = store
    first, second = twins("a", 1)
    await queue.enqueue(first)
    await queue.enqueue(second)
    assert (await queue.claim("alice", None)) == first
    assert (await queue.claim("bob", None)) == second
    await pass_claim_timeout(queue, clock)  # both claims time out; alice comes back first
    again = await queue.claim("alice", None)
    assert again is not None
    assert again.id == first.id  # her own item back, never bob's twin
    assert await queue.claim("alice", None) is None
