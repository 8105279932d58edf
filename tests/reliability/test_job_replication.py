"""Jobs and Redis's asynchronous replication: with ``wait_replicas`` a submission is answered only once a
replica holds it (``WAIT`` on the same connection); a Redis with no replica refuses it with a retryable
503, and the retry with the same Idempotency-Key finds the job stored the first time, never a second."""

from __future__ import annotations

import pytest

from gateway.errors import StateUnavailable
from gateway.http.services import redis_client
from gateway.jobs.models import Delivery, JobRecord
from gateway.jobs.store_memory import MemoryJobStore
from gateway.jobs.store_redis import RedisJobStore


def _record(job_id: str) -> JobRecord:
    return JobRecord(id=job_id, tenant="default", fingerprint="f", video_id="v", frames=1, request="{}")


async def test_a_submission_no_replica_holds_is_refused_and_its_retry_finds_the_same_job(
    redis_url: str,
) -> None:
    client = redis_client(redis_url)
    try:
        waiting = RedisJobStore(client, claim_idle_s=60, ttl_s=600, wait_replicas=1, wait_timeout_ms=50)
        with pytest.raises(StateUnavailable, match="0 of 1 replicas"):
            await waiting.submit(_record("job_first"), "video-7")
        plain = RedisJobStore(client, claim_idle_s=60, ttl_s=600)  # wait_replicas 0: no WAIT
        found, created = await plain.submit(_record("job_second"), "video-7")
        assert (found.id, created) == ("job_first", False)
    finally:
        await client.aclose()


async def test_a_job_requeued_at_stop_is_taken_again() -> None:
    store = MemoryJobStore()
    await store.submit(_record("job_m"), None)
    (delivery,) = await store.take("gateway-a", block_s=0.1)
    assert await store.requeue("gateway-a", delivery)
    assert await store.take("gateway-b", block_s=0.1) == [Delivery(entry_id="job_m", job_id="job_m")]


async def test_a_stopping_gateway_requeues_only_the_entries_still_its_own(redis_url: str) -> None:
    client = redis_client(redis_url)
    try:
        store = RedisJobStore(client, claim_idle_s=60, ttl_s=600)
        await store.submit(_record("job_r"), None)
        (delivery,) = await store.take("gateway-a", block_s=0.1)
        assert not await store.requeue("gateway-b", delivery)  # not b's: left alone
        assert await store.requeue("gateway-a", delivery)
        (again,) = await store.take("gateway-b", block_s=0.1)  # a new entry, for anyone, at once
        assert again.job_id == "job_r"
        assert again.entry_id != delivery.entry_id
        assert not await store.requeue("gateway-a", delivery)  # the old entry is gone
    finally:
        await client.aclose()
