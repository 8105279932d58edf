"""Keyframe batches as jobs: 202 and an id, the result by polling or a signed webhook, exactly once per
idempotency key; in memory (not durable, and saying so) or in Redis streams (durable; taken over if idle)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from gateway.caller import Caller
from gateway.jobs.models import JobRecord
from gateway.jobs.store_memory import MemoryJobStore
from gateway.jobs.store_redis import GROUP, STREAM, RedisJobStore
from gateway.jobs.webhooks import sign_webhook, verify_webhook
from tests.processes import poll_async
from tests.reliability.conftest import WEBHOOK_SECRET, WebhookReceiver, engine_counter, error_body
from tests.support import GatewayFactory, SimFactory, image_input

FRAMES = [make_keyframe("allow", 320, 180, seed=1), make_keyframe("block:violence", 320, 180, seed=2)]
JOB = {"video_id": "video-1", "frames": image_input(*FRAMES)}
WEBHOOKS = {"webhook_secret": WEBHOOK_SECRET, "webhook_allowlist": ["127.0.0.1"]}


async def finished(client: httpx.AsyncClient, job_id: str, timeout_s: float = 30, **headers: str) -> Any:
    """Poll ``GET /v1/jobs/{id}`` until the job has succeeded or failed."""

    async def done() -> Any:
        response = await client.get(f"/v1/jobs/{job_id}", headers=headers)
        assert response.status_code == 200, response.text
        job = response.json()
        return job if job["status"] in ("succeeded", "failed") else None

    return await poll_async(done, timeout_s, f"job {job_id} to finish")


async def test_a_job_is_accepted_with_202_and_its_result_can_be_polled(gateway: ThreadedServer) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=JOB)
        assert accepted.status_code == 202
        job = accepted.json()
        assert job["id"].startswith("job_")
        assert (job["status"], job["frames"], job["durable"]) == ("queued", 2, False)
        done = await finished(client, job["id"])
    assert done["status"] == "succeeded"
    assert [r["modgate"]["action"] for r in done["result"]["frames"]] == ["allow", "block"]
    assert done["attempts"] == 1
    assert done["completed_at"] >= done["created_at"]


async def test_the_same_idempotency_key_answers_the_same_job_and_runs_it_once(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim()
    gateway = start_gateway(engine_url=sim.url)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answers = [
            await client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "batch-42"}) for _ in range(3)
        ]
        assert [a.status_code for a in answers] == [202, 202, 202]
        assert len({a.json()["id"] for a in answers}) == 1
        assert [a.headers.get("idempotent-replayed") for a in answers] == [None, "true", "true"]
        await finished(client, answers[0].json()["id"])
        replay = await client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "batch-42"})
        engine = (await client.get(f"{sim.url}/metrics")).text
    assert replay.json()["status"] == "succeeded"
    assert engine_counter(engine, "vllm:request_success") == len(FRAMES)  # one job's frames, once


async def test_an_idempotency_key_reused_for_another_request_gets_409(gateway: ThreadedServer) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        first = await client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k1"})
        changed = {**JOB, "video_id": "v2"}
        other = await client.post("/v1/jobs", json=changed, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 202
    assert other.status_code == 409
    assert error_body(other)["code"] == "idempotency_key_reused"


async def test_another_tenants_job_reads_as_not_found(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys="key-a:tenant-a,key-b:tenant-b")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        job = (await client.post("/v1/jobs", json=JOB, headers={"Authorization": "Bearer key-a"})).json()
        mine = await client.get(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer key-a"})
        theirs = await client.get(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer key-b"})
        anonymous = await client.post("/v1/jobs", json=JOB)
    assert mine.status_code == 200
    assert theirs.status_code == 404
    assert anonymous.status_code == 401


async def test_the_webhook_is_signed_and_carries_the_finished_job(
    start_gateway: GatewayFactory, sim: ThreadedServer, webhook_receiver: WebhookReceiver
) -> None:
    gateway = start_gateway(engine_url=sim.url, jobs=WEBHOOKS)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        job = (await client.post("/v1/jobs", json={**JOB, "webhook_url": webhook_receiver.url})).json()
        await finished(client, job["id"])

        async def delivered() -> Any:
            return (await client.get(f"/v1/jobs/{job['id']}")).json()["webhook"]["status"] == "delivered"

        await poll_async(delivered, 10, "the webhook to be recorded as delivered")
        polled = (await client.get(f"/v1/jobs/{job['id']}")).json()
    (delivery,) = webhook_receiver.deliveries
    signature = delivery.headers["x-modgate-signature"]
    assert verify_webhook(WEBHOOK_SECRET, signature, delivery.body)
    assert not verify_webhook(WEBHOOK_SECRET, signature, delivery.body.replace(b"video-1", b"video-9"))
    assert not verify_webhook("another-secret-0123456789", signature, delivery.body)
    assert delivery.headers["x-modgate-delivery"] == job["id"]
    sent = delivery.json()
    assert sent["status"] == "succeeded"
    assert sent["result"] == polled["result"]


def test_a_stale_webhook_signature_is_refused() -> None:
    body = b'{"id": "job_x"}'
    header = sign_webhook(WEBHOOK_SECRET, 1_000_000, body)
    assert verify_webhook(WEBHOOK_SECRET, header, body, now=1_000_100)
    assert not verify_webhook(WEBHOOK_SECRET, header, body, now=1_000_000 + 3600)
    assert not verify_webhook(WEBHOOK_SECRET, "t=abc,v1=00", body)


async def test_a_refusing_receiver_gets_the_webhook_again(
    start_gateway: GatewayFactory, sim: ThreadedServer, webhook_receiver: WebhookReceiver
) -> None:
    webhook_receiver.fail_first[0] = 2
    gateway = start_gateway(engine_url=sim.url, jobs=WEBHOOKS)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        job = (await client.post("/v1/jobs", json={**JOB, "webhook_url": webhook_receiver.url})).json()

        async def delivered() -> Any:
            webhook = (await client.get(f"/v1/jobs/{job['id']}")).json()["webhook"]
            return webhook if webhook["status"] != "pending" else None

        webhook = await poll_async(delivered, 30, "the webhook to be delivered")
    assert (webhook["status"], webhook["attempts"]) == ("delivered", 3)
    assert len(webhook_receiver.deliveries) == 1


@pytest.mark.parametrize(
    ("jobs", "url", "code"),
    [
        (WEBHOOKS, "http://hooks.attacker.net/x", "webhook_refused"),
        (WEBHOOKS, "ftp://127.0.0.1/x", "invalid_request"),
        ({}, "http://127.0.0.1/x", "webhooks_disabled"),
    ],
    ids=["host off the allowlist", "not http", "no secret configured"],
)
async def test_a_webhook_url_the_gateway_will_not_call_gets_400(
    start_gateway: GatewayFactory, sim: ThreadedServer, jobs: dict[str, Any], url: str, code: str
) -> None:
    gateway = start_gateway(engine_url=sim.url, jobs=jobs)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        response = await client.post("/v1/jobs", json={**JOB, "webhook_url": url})
    assert response.status_code == 400
    assert (error_body(response)["code"], error_body(response)["param"]) == (code, "webhook_url")


async def test_a_frame_with_bad_base64_is_refused_at_submission(gateway: ThreadedServer) -> None:
    frames = [*JOB["frames"], {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,!!"}}]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        response = await client.post("/v1/jobs", json={**JOB, "frames": frames})
    assert response.status_code == 400
    assert (error_body(response)["code"], error_body(response)["param"]) == ("invalid_data_url", "frames[2]")


async def test_too_many_frames_are_refused(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, jobs={"max_frames": 1})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        response = await client.post("/v1/jobs", json=JOB)
    assert (response.status_code, error_body(response)["param"]) == (400, "frames")


async def test_an_undecodable_frame_fails_the_job_with_its_error(gateway: ThreadedServer) -> None:
    truncated = FRAMES[0][: len(FRAMES[0]) // 2]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        job = (await client.post("/v1/jobs", json={"video_id": "v", "frames": image_input(truncated)})).json()
        done = await finished(client, job["id"])
    assert done["status"] == "failed"
    assert done["error"]["code"] == "image_decode_failed"
    assert done["attempts"] == 1  # the caller's fault: not retried


async def test_engine_failures_are_retried_until_the_job_succeeds(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim(faults=Faults(error_rate=1.0))
    gateway = start_gateway(
        engine_url=sim.url, jobs={"retry_wait_s": 0.2, "max_attempts": 20}, circuit={"cooldown_s": 0.2}
    )
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        job = (await client.post("/v1/jobs", json=JOB)).json()

        async def failed_once() -> bool:
            return bool((await client.get(f"/v1/jobs/{job['id']}")).json()["attempts"] >= 2)

        await poll_async(failed_once, 20, "a failed attempt")
        await client.post(f"{sim.url}/sim/faults", json={})
        done = await finished(client, job["id"])
    assert done["status"] == "succeeded"
    assert done["attempts"] >= 2


async def test_a_job_whose_engine_never_recovers_fails_after_its_attempts(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim(faults=Faults(error_rate=1.0))
    gateway = start_gateway(engine_url=sim.url, jobs={"retry_wait_s": 0.05, "max_attempts": 3})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        job = (await client.post("/v1/jobs", json=JOB)).json()
        done = await finished(client, job["id"])
    assert done["status"] == "failed"
    assert done["attempts"] == 3
    assert done["error"]["type"] == "server_error"


# --- Redis ---------------------------------------------------------------------------------------------


async def test_with_redis_a_job_is_durable_and_leaves_nothing_queued(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str
) -> None:
    gateway = start_gateway(engine_url=sim.url, redis_url=redis_url)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = (await client.post("/v1/jobs", json=JOB)).json()
        done = await finished(client, accepted["id"])
    assert accepted["durable"] is True
    assert done["status"] == "succeeded"
    state = aioredis.Redis.from_url(redis_url)
    try:
        stored = await state.hgetall(RedisJobStore.job_key(accepted["id"]))
        assert stored[b"completions"] == b"1"
        assert b"request" not in stored  # the frames are dropped once the job is finished
        assert 0 < await state.ttl(RedisJobStore.job_key(accepted["id"])) <= 7 * 86400
        await poll_async(lambda: acknowledged(state), 10, "the job's stream entry to be acknowledged")
    finally:
        await state.aclose()


async def test_two_gateways_on_one_redis_share_idempotency_keys(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str
) -> None:
    first = start_gateway(engine_url=sim.url, redis_url=redis_url)
    second = start_gateway(engine_url=sim.url, redis_url=redis_url)
    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(
            *(
                client.post(f"{gateway.url}/v1/jobs", json=JOB, headers={"Idempotency-Key": "shared"})
                for gateway in (first, second, first, second)
            )
        )
    assert len({a.json()["id"] for a in answers}) == 1
    assert sorted(a.headers.get("idempotent-replayed", "") for a in answers) == ["", "true", "true", "true"]


async def acknowledged(state: aioredis.Redis) -> bool:
    """No entry left on the jobs stream, none pending."""
    return bool(await state.xlen(STREAM) == 0 and (await state.xpending(STREAM, GROUP))["pending"] == 0)


def job_record(job_id: str) -> JobRecord:
    request = json.dumps({"video_id": "v", "frames": image_input(FRAMES[1])})
    return JobRecord(id=job_id, tenant="default", fingerprint="f", video_id="v", frames=1, request=request)


async def test_a_job_left_pending_by_a_dead_gateway_is_taken_over(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    store = RedisJobStore(client, claim_idle_s=0.3, ttl_s=3600)
    job_id = "job_" + "d" * 32
    try:
        await store.submit(job_record(job_id), None)
        (taken,) = await store.take("dead-gateway", block_s=1.0)  # read, then the gateway "dies"
        assert taken.job_id == job_id
        assert (await client.xpending(STREAM, GROUP))["consumers"][0]["name"] == b"dead-gateway"
        gateway = start_gateway(engine_url=sim.url, redis_url=redis_url, jobs={"claim_idle_s": 0.3})
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            done = await finished(http, job_id)
        assert done["status"] == "succeeded"
        assert done["result"]["frames"][0]["modgate"]["action"] == "block"
        await poll_async(lambda: acknowledged(client), 10, "the job's stream entry to be acknowledged")
    finally:
        await client.aclose()


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_job_worked_twice_completes_once(kind: str, redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    store = MemoryJobStore() if kind == "memory" else RedisJobStore(client, claim_idle_s=60, ttl_s=3600)
    job_id = "job_" + "e" * 32
    try:
        await store.submit(job_record(job_id), None)
        assert await store.start_attempt(job_id) == 1
        assert await store.start_attempt(job_id) == 2  # a takeover racing a slow gateway
        outcomes = await asyncio.gather(
            *(store.complete(job_id, "succeeded", result=json.dumps({"by": n}), error=None) for n in range(5))
        )
        record = await store.get(job_id)
        assert await store.start_attempt(job_id) == 0  # finished: no further attempt starts
    finally:
        await client.aclose()
    assert sorted(outcomes) == [False, False, False, False, True]
    assert record is not None
    assert (record.status, record.completions) == ("succeeded", 1)


def test_a_caller_is_the_tenant_the_job_belongs_to() -> None:
    assert Caller(tenant="t", key_id="job").tenant == "t"
