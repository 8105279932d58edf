"""A label the decision log cannot take at first (Redis down) is tried again in the background until Redis
is back; one it never takes is counted in ``modgate_decisions_unlogged_total``, never lost silently."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from contracts.decisions import DecisionRow
from gateway.decisions.log import RedisDecisionLog
from gateway.decisions.rows import review_label_row
from gateway.http.services import redis_client
from gateway.review.models import Label, LabelledItem, ReviewItem
from gateway.series.metrics import GatewayMetrics
from gateway.settings import DecisionSettings
from tests.processes import RedisServer

STREAM = "test:retry:decisions"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, to stop and start again."""
    server = RedisServer(tmp_path / "redis", persistent=False).start()
    yield server
    server.stop()


def labelled() -> LabelledItem:
    item = ReviewItem(
        id="rev-1",
        tenant="news",
        frame="",
        action="block",
        categories=("violence",),
        confidence=0.97,
        reason="audit",
        audit_sample_rate=0.05,
        thinking="off",
        reasoning=None,
        request_id="modr-1-0",
        enqueued_at=1_764_000_000.0,
        frame_sha256="a" * 64,
    )
    return LabelledItem(item, Label("allow", (), "alice (admin:1a2b)", 1_764_000_100.0))


def unlogged_total(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("modgate_decisions_unlogged_total") or 0.0


def test_a_label_appended_while_redis_is_down_is_stored_once_it_is_back(private_redis: RedisServer) -> None:
    metrics = GatewayMetrics()
    registry = metrics.registry
    settings = DecisionSettings(stream=STREAM, redis_timeout_s=0.5, retry_attempts=50, retry_timeout_s=120)

    async def scenario() -> list[DecisionRow]:
        client = redis_client(private_redis.url)
        log = RedisDecisionLog(client, settings, metrics.not_logged)
        try:
            private_redis.stop()
            await log.append([review_label_row(labelled())])  # fails at once: the answer does not wait
            await asyncio.to_thread(private_redis.start)  # same port, empty: the retry finds it
            await log.flush()
            entries = await client.xrange(STREAM)
            return [DecisionRow.model_validate_json(fields[b"row"]) for _, fields in entries]
        finally:
            await client.aclose()

    (row,) = asyncio.run(scenario())
    assert (row.kind, row.automated, row.action, row.labelled_by) == (
        "label",
        False,
        "allow",
        "alice (admin:1a2b)",
    )
    assert (row.review_reason, row.audit_sample_rate, row.engine_request_id) == ("audit", 0.05, "modr-1-0")
    assert unlogged_total(registry) == 0


def test_a_label_the_log_never_takes_is_counted_as_unlogged(private_redis: RedisServer) -> None:
    metrics = GatewayMetrics()
    registry = metrics.registry
    settings = DecisionSettings(stream=STREAM, redis_timeout_s=0.2, retry_attempts=3, retry_timeout_s=5)

    async def scenario() -> None:
        client = redis_client(private_redis.url)
        log = RedisDecisionLog(client, settings, metrics.not_logged)
        try:
            private_redis.stop()
            await log.append([review_label_row(labelled())])
            assert unlogged_total(registry) == 0  # not yet: it is being tried again
            await log.flush()
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert unlogged_total(registry) == 1


def test_a_gateway_stopping_while_a_label_is_retried_counts_it_as_unlogged(
    private_redis: RedisServer,
) -> None:
    metrics = GatewayMetrics()
    registry = metrics.registry
    settings = DecisionSettings(stream=STREAM, redis_timeout_s=0.2, retry_attempts=100, retry_timeout_s=600)

    async def scenario() -> None:
        client = redis_client(private_redis.url)
        log = RedisDecisionLog(client, settings, metrics.not_logged)
        try:
            private_redis.stop()
            await log.append([review_label_row(labelled())])
            await log.close(timeout_s=0.5)  # what the lifespan does at shutdown
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert unlogged_total(registry) == 1


def test_a_row_whose_append_timed_out_after_redis_took_it_is_stored_once(private_redis: RedisServer) -> None:
    settings = DecisionSettings(stream=STREAM, redis_timeout_s=0.2, retry_attempts=50, retry_timeout_s=60)
    assert private_redis.process is not None
    pid = private_redis.process.pid

    async def scenario() -> int:
        client = redis_client(private_redis.url)
        log = RedisDecisionLog(client, settings)
        try:
            await client.ping()  # connected: the append's bytes reach the stalled server's socket
            os.kill(pid, signal.SIGSTOP)  # a stall: the XADD waits in its socket past the timeout
            try:
                await log.append([review_label_row(labelled())])
                await asyncio.sleep(0.5)  # the retries meet the stall too
            finally:
                os.kill(pid, signal.SIGCONT)  # it wakes and runs the first try: the retry must add nothing
            await log.flush()
            return len(await client.xrange(STREAM))
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == 1
