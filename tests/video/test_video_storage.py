"""A posted video waits beside its job in Redis as its own bytes, not base64 in the job, and goes with it."""

from __future__ import annotations

import httpx
import redis.asyncio as aioredis

from cli.embedded import ThreadedServer
from deploy.simulator import Faults
from deploy.videos import make_video
from gateway.jobs.store_redis import RedisJobStore
from gateway.jobs.video import STORED_VIDEO
from tests.support import GatewayFactory, SimFactory
from tests.video.test_video_jobs import VIOLENT_MIDDLE, finished, job_body


async def test_a_posted_videos_bytes_wait_beside_the_job_and_go_when_it_finishes(
    start_sim: SimFactory, start_gateway: GatewayFactory, redis_url: str
) -> None:
    sim = start_sim(faults=Faults(slow_rate=1.0, slow_s=1.0))  # the job runs a while: read it meanwhile
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": redis_url})
    video = make_video(VIOLENT_MIDDLE)
    state = aioredis.Redis.from_url(redis_url)
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
            accepted = await client.post("/v1/jobs", json=job_body("stored-1", video))
            assert accepted.status_code == 202, accepted.text
            key = RedisJobStore.job_key(accepted.json()["id"])
            request = await state.hget(key, "request")
            kept = await state.get(f"{key}:video")
            job = await finished(client, accepted.json()["id"])
        assert job["status"] == "succeeded", job
        assert request is not None
        assert len(request) < 2000
        assert STORED_VIDEO.encode() in request
        assert kept == video  # the bytes as posted, not their base64
        assert await state.exists(f"{key}:video", f"{key}:parts") == 0
    finally:
        await state.aclose()


async def test_a_multipart_idempotency_key_replays_its_job_for_the_same_file_and_refuses_another(
    gateway: ThreadedServer,
) -> None:
    """The file's bytes go to the job as they are: the request's fingerprint covers them."""
    first, second = make_video(VIOLENT_MIDDLE), make_video(VIOLENT_MIDDLE[:2])
    job = (None, '{"video_id": "idem-1"}', "application/json")
    headers = {"Idempotency-Key": "multipart-idem-1"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        original = await client.post("/v1/jobs", files={"video": ("a.mp4", first, "video/mp4"), "job": job},
                                     headers=headers)
        again = await client.post("/v1/jobs", files={"video": ("a.mp4", first, "video/mp4"), "job": job},
                                  headers=headers)
        other = await client.post("/v1/jobs", files={"video": ("b.mp4", second, "video/mp4"), "job": job},
                                  headers=headers)
    assert (original.status_code, again.status_code, other.status_code) == (202, 202, 409)
    assert again.json()["id"] == original.json()["id"]


async def test_a_json_body_naming_the_stored_video_is_refused(gateway: ThreadedServer) -> None:
    body = {"video_id": "named-1", "video": {"url": STORED_VIDEO}}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answer = await client.post("/v1/jobs", json=body)
    assert answer.status_code == 400, answer.text
