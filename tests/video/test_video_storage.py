"""A posted video waits in the spool as a file, the job store holding its reference; once cut, only its
shaped frames wait beside the job (never the video, never base64), and they go when the job finishes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from cli.embedded import ThreadedServer
from deploy.simulator import Faults
from deploy.videos import make_video
from gateway.jobs.models import FINISHED
from gateway.jobs.store import JobStore
from gateway.jobs.store_memory import MemoryJobStore
from gateway.jobs.store_redis import RedisJobStore
from gateway.jobs.video import STORED_VIDEO, cut_from_kept
from tests.processes import poll_async
from tests.support import GatewayFactory, SimFactory
from tests.video.test_video_jobs import VIOLENT_MIDDLE, finished


async def footprint(state: aioredis.Redis, job_id: str) -> dict[str, int]:
    """Each of the job's keys and the bytes Redis holds for it (``MEMORY USAGE``)."""
    key = RedisJobStore.job_key(job_id)
    names = [name.decode() async for name in state.scan_iter(f"{key}*")]
    return {name: int(await state.memory_usage(name) or 0) for name in names}


async def test_a_posted_video_waits_as_a_file_and_only_its_cut_frames_wait_in_redis(
    start_sim: SimFactory, start_gateway: GatewayFactory, redis_url: str, tmp_path: Path
) -> None:
    sim = start_sim(faults=Faults(slow_rate=1.0, slow_s=1.0))  # the job is judged a while: read it meanwhile
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": redis_url},
                            videos={"spool_dir": str(tmp_path)})
    video = make_video(VIOLENT_MIDDLE, width=1280, height=720, fps=25)  # a few MB
    state = aioredis.Redis.from_url(redis_url)
    files = {"video": ("clip.mp4", video, "video/mp4"),
             "job": (None, '{"video_id": "kept-1"}', "application/json")}
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
            accepted = await client.post("/v1/jobs", files=files)
            assert accepted.status_code == 202, accepted.text
            job_id = accepted.json()["id"]
            key = RedisJobStore.job_key(job_id)
            record = await state.hgetall(key)

            async def judging() -> Any:
                job = (await client.get(f"/v1/jobs/{job_id}")).json()
                return job.get("progress") or job["status"] in FINISHED

            await poll_async(judging, 60, "the video to be cut")
            while_judged = await footprint(state, job_id)
            kept = await state.get(f"{key}:cut")
            spooled_meanwhile = sorted(tmp_path.iterdir())
            job = await finished(client, job_id)
            after = await footprint(state, job_id)
    finally:
        await state.aclose()
    assert job["status"] == "succeeded", job
    assert [s["action"] for s in job["result"]["segments"]] == ["allow", "block", "allow"]
    # at submission: the job's hash holds the file's reference, its request names the stored video
    reference = json.loads(record[b"video_file"])
    assert reference == {"job_id": job_id, "size": len(video), "sha256": hashlib.sha256(video).hexdigest()}
    assert STORED_VIDEO.encode() in record[b"request"]
    assert len(record[b"request"]) < 2000
    # once cut: the file is gone, the cut waits beside the job: its shaped frames, a fraction of the video
    assert spooled_meanwhile == []
    assert kept is not None
    cut = cut_from_kept(kept)
    assert len(cut.frames) == job["result"]["coverage"]["sent"]
    assert sum(len(frame.jpeg) for frame in cut.frames) <= len(kept) < len(video) // 10
    assert f"{key}:cut" in while_judged
    assert set(while_judged) <= {key, f"{key}:cut", f"{key}:parts"}  # no key of the video's bytes
    assert sum(while_judged.values()) < len(video) // 10
    assert set(after) == {key}  # the cut and the chunks go when the job finishes
    assert after[key] < len(video) // 20  # the finished job's hash: its result document


async def test_a_multipart_idempotency_key_replays_its_job_for_the_same_file_and_refuses_another(
    start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path
) -> None:
    """The file's hash is in the request's fingerprint; a replay's or a refused upload's file is deleted."""
    gateway = start_gateway(engine={"url": sim.url}, videos={"spool_dir": str(tmp_path)})
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
        done = await finished(client, original.json()["id"])
    assert (original.status_code, again.status_code, other.status_code) == (202, 202, 409)
    assert again.json()["id"] == original.json()["id"]
    assert done["status"] == "succeeded", done
    assert list(tmp_path.iterdir()) == []


async def test_a_json_body_naming_the_stored_video_is_refused(gateway: ThreadedServer) -> None:
    body = {"video_id": "named-1", "video": {"url": STORED_VIDEO}}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answer = await client.post("/v1/jobs", json=body)
    assert answer.status_code == 400, answer.text


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_job_store_keeps_a_cut_beside_its_job_until_it_is_dropped(kind: str, request: Any) -> None:
    """The job-store contract for a video's cut: kept as bytes, read back whole, dropped with the parts."""
    client = aioredis.Redis.from_url(request.getfixturevalue("redis_url")) if kind == "redis" else None
    store: JobStore = (MemoryJobStore() if client is None
                       else RedisJobStore(client, claim_idle_s=60, ttl_s=600))
    cut = bytes(range(256)) * 64  # bytes as they are: no text encoding may touch them
    try:
        assert await store.cut("job_1") is None
        await store.save_cut("job_1", cut)
        await store.save_part("job_1", "chunk:a", "{}")
        assert await store.cut("job_1") == cut
        if client is not None:
            ttl = await client.ttl(f"{RedisJobStore.job_key('job_1')}:cut")
            assert 0 < ttl <= 600  # it expires with the job's time to live, if nothing drops it
        await store.drop_parts("job_1")
        assert await store.cut("job_1") is None
        assert await store.parts("job_1") == {}
    finally:
        if client is not None:
            await client.aclose()
