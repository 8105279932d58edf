"""Review items and decision rows and Redis's asynchronous replication (the soak lost a review item answered
just before a primary was killed): with ``wait_replicas`` an item is answered once a replica holds it, or
counted as unreplicated, and a decision append a replica did not take in time is tried again in the
background until one does (once: the batch's key refuses a second run), never dropped."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from bench.cluster import SYNC_NOW, RedisProcess
from gateway.decisions.log import RedisDecisionLog
from gateway.review.service import ReviewQueue
from gateway.review.store_redis import RedisReviewStore
from gateway.series.review import ReviewMetrics
from gateway.settings import DecisionSettings, JobSettings, ReviewSettings
from gateway.state import SOCKET_TIMEOUT_S
from shaping.verdict import KeyframeVerdict
from tests.quality.test_label_strata import decision
from tests.review.test_review_store import item

pytestmark = pytest.mark.redis


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    """A primary and one replica of it, synced."""
    primary = RedisProcess(tmp_path / "primary", extra=SYNC_NOW).start()
    follows = ("--replicaof", "127.0.0.1", str(primary.port))
    replica = RedisProcess(tmp_path / "replica", extra=follows).start()
    watch = redis.Redis(port=primary.port)
    deadline = time.monotonic() + 20
    # online: past the full sync (a replica still waiting for it acknowledges no WAIT for seconds)
    while (watch.info("replication").get("slave0") or {}).get("state") != "online":
        assert time.monotonic() < deadline, "the replica did not sync"
        time.sleep(0.05)
    watch.close()
    yield primary, replica
    for server in (replica, primary):
        if server.process is not None and server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.kill()


def frozen(server: RedisProcess) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)  # alive, connected, acknowledging nothing


def thawed(server: RedisProcess) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGCONT)


async def test_a_review_item_is_on_the_replica_when_it_is_answered(
    pair: tuple[RedisProcess, RedisProcess],
) -> None:
    primary, replica = pair
    client = aioredis.Redis.from_url(primary.url)
    try:
        store = RedisReviewStore(client, claim_timeout_s=60, retention_s=3600, wait_replicas=1,
                                 wait_timeout_ms=3000)  # within the client's socket timeout, as settings say
        queued = item("news")
        assert await store.enqueue(queued)
        on_replica = redis.Redis(port=replica.port)
        assert on_replica.exists(RedisReviewStore.item_key(queued.id))  # WAIT: applied there already
        on_replica.close()
    finally:
        await client.aclose()


async def test_an_item_no_replica_took_in_time_is_queued_and_counted_unreplicated(
    pair: tuple[RedisProcess, RedisProcess],
) -> None:
    primary, replica = pair
    client = aioredis.Redis.from_url(primary.url)
    try:
        settings = ReviewSettings(review_below=0.5, wait_replicas=1, wait_timeout_ms=100)
        store = RedisReviewStore(client, claim_timeout_s=60, retention_s=3600, wait_replicas=1,
                                 wait_timeout_ms=100)
        metrics = ReviewMetrics(CollectorRegistry(), settings.oldest_alert_s)
        queue = ReviewQueue(store, settings, metrics=metrics)
        frozen(replica)
        queued = item("news")
        assert not await store.enqueue(queued)
        unsure = await queue.offer("news", "data:image/jpeg;base64,AAA1", KeyframeVerdict("review"), "off",
                                   None, "modr-1")
        assert unsure is not None  # queued all the same, on the primary
        assert metrics.unreplicated._value.get() == 1
        claims = [await store.claim("alice", None), await store.claim("alice", None)]
        assert {claim.id for claim in claims if claim is not None} == {queued.id, unsure.id}
    finally:
        thawed(replica)
        await client.aclose()


async def test_a_decision_append_a_replica_did_not_take_is_tried_again_until_one_does(
    pair: tuple[RedisProcess, RedisProcess], tmp_path: Path,
) -> None:
    primary, replica = pair
    client = aioredis.Redis.from_url(primary.url)
    try:
        settings = DecisionSettings(archive_dir=tmp_path, redis_timeout_s=0.2, wait_replicas=1,
                                    retry_timeout_s=20)
        log = RedisDecisionLog(client, settings)
        frozen(replica)
        await log.append([decision("allow"), decision("block")])
        assert log._retrying  # not held by a replica: being tried again, not dropped
        await asyncio.sleep(0.5)
        thawed(replica)
        async with asyncio.timeout(20):
            await log.flush()
        on_replica = redis.Redis(port=replica.port)
        assert on_replica.xlen(settings.stream) == 2  # both rows, once, though several tries ran
        on_replica.close()
    finally:
        await client.aclose()


@pytest.mark.parametrize("group", [ReviewSettings, JobSettings])
def test_a_wait_longer_than_the_redis_clients_timeout_is_refused_at_start(
    group: type[ReviewSettings] | type[JobSettings],
) -> None:
    """A WAIT of 5 s or more would end as the client's 5 s socket timeout ("Redis unreachable", a 503 on
    every write while a replica lags) rather than as too few replicas: the settings stop at 4 s."""
    assert group.model_validate({"wait_timeout_ms": 4000}).wait_timeout_ms == 4000 < SOCKET_TIMEOUT_S * 1000
    with pytest.raises(ValidationError, match="less than or equal to 4000"):
        group.model_validate({"wait_timeout_ms": 5000})


def test_a_decision_log_timeout_past_the_redis_clients_is_refused_at_start() -> None:
    """An append (and its WAIT, nine tenths of it) must end before the client's 5 s socket timeout, or a
    lagging replica reads as "Redis unreachable": the setting stops at 4 s, as the jobs' WAIT limit does."""
    held = DecisionSettings.model_validate({"redis_timeout_s": 4.0}).redis_timeout_s
    assert held == 4.0 < SOCKET_TIMEOUT_S
    with pytest.raises(ValidationError, match="less than or equal to 4"):
        DecisionSettings.model_validate({"redis_timeout_s": SOCKET_TIMEOUT_S + 1})
