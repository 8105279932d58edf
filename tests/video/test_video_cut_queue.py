"""Cut work is bounded at the door: a video submission behind a full queue gets 429 ``video_cut_busy``; a
job already taken waits for a cut thread and is never failed for it."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar.testing import AsyncTestClient

from deploy.videos import Scene, make_video
from gateway.http.app import create_app
from gateway.http.providers import services_of
from gateway.settings import Settings
from tests.processes import poll_async
from tests.video.test_video_jobs import job_body

SHOTS = [Scene("allow", 1, seed=1), Scene("block:violence", 1, seed=2)]


class Held:
    """The moderation service's ``moderate``, held until released: its job stays running meanwhile."""

    def __init__(self, moderate: Any) -> None:
        self.moderate = moderate
        self.release: asyncio.Event | None = None  # made on the app's loop

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.release is None:
            self.release = asyncio.Event()
        await self.release.wait()
        return await self.moderate(*args, **kwargs)


async def finished(client: AsyncTestClient[Any], job_id: str) -> Any:
    """The job once it has succeeded or failed."""

    async def done() -> Any:
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        return job if job["status"] in ("succeeded", "failed") else None

    return await poll_async(done, 30, f"job {job_id} to finish")


async def test_a_video_submitted_behind_a_full_cut_queue_gets_a_429_with_retry_after(sim: Any) -> None:
    app = create_app(Settings(engine={"url": sim.url}))
    video = make_video(SHOTS)
    async with AsyncTestClient(app, timeout=30) as client:
        videos = services_of(app).jobs.videos
        videos.max_queued = 1
        moderation = services_of(app).moderation
        held = Held(moderation.moderate)
        moderation.moderate = held
        first = await client.post("/v1/jobs", json=job_body("queued-1", video))
        assert first.status_code == 202, first.text
        refused = await client.post("/v1/jobs", json=job_body("queued-2", video))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "video_cut_busy"
        assert int(refused.headers["retry-after"]) > 0
        await poll_async(lambda: held.release, 30, "the first job to reach the engine")
        assert held.release is not None
        await asyncio.to_thread(client.blocking_portal.call, held.release.set)
        assert (await finished(client, first.json()["id"]))["status"] == "succeeded"
        again = await client.post("/v1/jobs", json=job_body("queued-2", video))
        assert again.status_code == 202, again.text
        assert (await finished(client, again.json()["id"]))["status"] == "succeeded"


async def test_video_jobs_beyond_the_cut_threads_wait_their_turn_and_all_succeed(sim: Any) -> None:
    settings = Settings(engine={"url": sim.url}, videos={"cut_workers": 1}, jobs={"concurrency": 3})
    app = create_app(settings)
    video = make_video(SHOTS)
    async with AsyncTestClient(app, timeout=30) as client:
        accepted = [await client.post("/v1/jobs", json=job_body(f"turn-{n}", video)) for n in range(3)]
        jobs = [await finished(client, answer.json()["id"]) for answer in accepted]
    assert [job["status"] for job in jobs] == ["succeeded"] * 3
    assert all(job["result"]["segments"][-1]["action"] == "block" for job in jobs)
