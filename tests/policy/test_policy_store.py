"""Policy stores: versions, audit, history and rollback in memory and in a real Redis; replicas in step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import pytest
import redis.asyncio as aioredis

from bench.servers import free_port
from gateway.errors import Conflict, NotFound, StateUnavailable
from gateway.http.services import redis_client
from gateway.policy.rules import PolicyStore, ThinkingPolicy
from gateway.policy.store import MemoryPolicyStore, RedisPolicyStore
from tests.processes import poll_async

PREFIX = "modgate:thinking-policy"
StoreFactory = Callable[[], Awaitable[RedisPolicyStore]]


@pytest.fixture
async def open_redis_store(redis_url: str) -> AsyncIterator[StoreFactory]:
    """Start Redis-backed stores (each one a replica, on a client of its own) on the test database; stopped
    after the test."""
    async with AsyncExitStack() as stack:

        async def open_store() -> RedisPolicyStore:
            client = redis_client(redis_url)
            stack.push_async_callback(client.aclose)
            store = RedisPolicyStore(client, key_prefix=PREFIX, reload_interval_s=30.0)
            await store.start()
            stack.push_async_callback(store.stop)
            return store

        yield open_store


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[PolicyStore]:
    """Each behaviour both stores share, run against each."""
    if request.param == "memory":
        yield MemoryPolicyStore()
        return
    client = redis_client(request.getfixturevalue("redis_url"))
    redis_store = RedisPolicyStore(client, key_prefix=PREFIX)
    await redis_store.start()
    yield redis_store
    await redis_store.stop()
    await client.aclose()


@pytest.fixture
async def shared_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client on the Redis the replicas share, to do to it what no replica would."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_a_flip_installs_the_next_version_and_audits_who_why_and_what(store: PolicyStore) -> None:
    update = await store.replace(ThinkingPolicy(default_mode="off"), "alice (admin:1234)", "queue too long")
    assert update.changed
    assert store.current().version == update.policy.version == 2
    assert store.current().default_mode == "off"
    assert (store.current().updated_by, store.current().reason) == ("alice (admin:1234)", "queue too long")
    entry = (await store.audit(10))[0]
    assert (entry.actor, entry.action, entry.reason) == ("alice (admin:1234)", "set", "queue too long")
    assert (entry.old_version, entry.new_version) == (1, 2)
    assert entry.new_hash == store.current().content_hash() != entry.old_hash
    assert entry.changes == {"default_mode": {"old": "on", "new": "off"}}


async def test_a_flip_that_changes_nothing_makes_no_version(store: PolicyStore) -> None:
    update = await store.replace(ThinkingPolicy(), "alice", "same as before")
    assert not update.changed
    assert store.current().version == 1
    assert all(entry.action != "set" for entry in await store.audit(10))


async def test_a_flip_made_from_a_stale_version_is_refused_and_changes_nothing(store: PolicyStore) -> None:
    await store.replace(ThinkingPolicy(default_mode="off"), "alice", "first", expected_version=1)
    with pytest.raises(Conflict) as refused:
        await store.replace(ThinkingPolicy(shadow_share=0.2), "bob", "second", expected_version=1)
    assert refused.value.status == 409
    assert (store.current().version, store.current().shadow_share) == (2, 0.0)


async def test_a_rollback_restores_an_earlier_content_as_a_new_version(store: PolicyStore) -> None:
    await store.replace(ThinkingPolicy(default_mode="off"), "alice", "busy")
    await store.replace(ThinkingPolicy(default_mode="off", shadow_share=0.1), "alice", "measure")
    update = await store.rollback(None, "bob", "undo the shadow share")
    assert (update.policy.version, update.policy.default_mode, update.policy.shadow_share) == (4, "off", 0.0)
    assert (await store.audit(1))[0].action == "rollback"
    back_to_first = await store.rollback(1, "bob", "all the way back")
    assert (back_to_first.policy.version, back_to_first.policy.default_mode) == (5, "on")


async def test_a_rollback_to_a_version_that_does_not_exist_is_a_404(store: PolicyStore) -> None:
    with pytest.raises(NotFound):
        await store.rollback(None, "bob", "nothing before version 1")
    await store.replace(ThinkingPolicy(default_mode="off"), "alice", "busy")
    with pytest.raises(NotFound):
        await store.rollback(7, "bob", "a version from the future")


async def test_the_history_lists_documents_newest_first(store: PolicyStore) -> None:
    for share in (0.1, 0.2):
        await store.replace(ThinkingPolicy(shadow_share=share), "alice", f"share {share}")
    history = await store.history(10)
    assert [(doc.version, doc.shadow_share) for doc in history] == [(3, 0.2), (2, 0.1), (1, 0.0)]
    assert [doc.version for doc in await store.history(2)] == [3, 2]


async def test_a_flip_through_one_replica_reaches_the_other_through_pub_sub(
    open_redis_store: StoreFactory,
) -> None:
    first, second = await open_redis_store(), await open_redis_store()
    await first.replace(ThinkingPolicy(default_mode="off"), "alice", "busy")
    # The periodic reload is 30 s away: only the published message can make this in time.
    await poll_async(
        lambda: second.current().version == 2 and second.current().default_mode == "off",
        1.0,
        "the flip to reach the other replica",
        every_s=0.01,
    )


async def test_concurrent_flips_from_the_same_version_cannot_both_win(open_redis_store: StoreFactory) -> None:
    first, second = await open_redis_store(), await open_redis_store()
    outcomes = await asyncio.gather(
        first.replace(ThinkingPolicy(default_mode="off"), "alice", "from one", expected_version=1),
        second.replace(ThinkingPolicy(shadow_share=0.3), "bob", "from two", expected_version=1),
        return_exceptions=True,
    )
    assert sorted(type(outcome).__name__ for outcome in outcomes) == ["Conflict", "PolicyUpdate"]
    assert [entry.new_version for entry in await first.audit(10) if entry.action == "set"] == [2]


async def test_concurrent_flips_without_a_version_both_land_one_after_the_other(
    open_redis_store: StoreFactory,
) -> None:
    first, second = await open_redis_store(), await open_redis_store()
    updates = await asyncio.gather(
        *(
            replica.replace(ThinkingPolicy(shadow_share=share), who, "race")
            for replica, share, who in ((first, 0.1, "alice"), (second, 0.2, "bob"), (first, 0.3, "carol"))
        )
    )
    assert sorted(update.policy.version for update in updates) == [2, 3, 4]
    audited = [
        (entry.old_version, entry.new_version) for entry in await first.audit(10) if entry.action == "set"
    ]
    assert audited == [(3, 4), (2, 3), (1, 2)]


async def test_a_replica_started_later_takes_the_shared_document(open_redis_store: StoreFactory) -> None:
    first = await open_redis_store()
    await first.replace(ThinkingPolicy(default_mode="off"), "alice", "busy")
    late = await open_redis_store()
    assert (late.current().version, late.current().default_mode) == (2, "off")


async def test_redis_that_lost_its_data_is_reseeded_with_the_last_known_policy(
    open_redis_store: StoreFactory, shared_redis: aioredis.Redis
) -> None:
    replica = await open_redis_store()
    await replica.replace(ThinkingPolicy(default_mode="off"), "alice", "busy")
    await shared_redis.flushdb()  # what a restart without persistence looks like
    await replica.sync()
    assert await shared_redis.hget(PREFIX, "version") == "2"
    stored = ThinkingPolicy.model_validate_json(await shared_redis.hget(PREFIX, "document") or "")
    assert stored.default_mode == "off"
    (seed,) = list(await replica.audit(10))
    assert (seed.action, seed.new_version) == ("seed", 2)


async def test_an_unreadable_shared_document_leaves_the_policy_in_force(
    open_redis_store: StoreFactory, shared_redis: aioredis.Redis
) -> None:
    replica = await open_redis_store()
    await replica.replace(ThinkingPolicy(default_mode="off"), "alice", "busy")
    await shared_redis.hset(PREFIX, mapping={"version": 3, "document": '{"default_mode": "sometimes"}'})
    await replica.sync()
    assert (replica.current().version, replica.current().default_mode) == (2, "off")
    update = await replica.replace(ThinkingPolicy(default_mode="on"), "alice", "repair it")
    assert update.policy.version == 4  # past the unreadable version 3: versions only go up


async def test_a_store_whose_redis_is_unreachable_serves_the_default_and_refuses_flips() -> None:
    client = redis_client(f"redis://127.0.0.1:{free_port()}/0")
    replica = RedisPolicyStore(client, timeout_s=0.5)
    await replica.start()
    try:
        assert (replica.current().version, replica.current().default_mode) == (1, "on")
        status = replica.status()
        assert not status.available
        assert "unreachable" in (status.detail or "")
        with pytest.raises(StateUnavailable) as refused:
            await replica.replace(ThinkingPolicy(default_mode="off"), "alice", "busy")
        assert refused.value.status == 503
        assert refused.value.code == "policy_store_unavailable"
        assert replica.current().default_mode == "on"
        with pytest.raises(StateUnavailable):
            await replica.audit(10)
    finally:
        await replica.stop()
        await client.aclose()
