"""A video job cut and judged once: a failed attempt's other chunks stop, a retry takes the kept cut and asks
only for what is unanswered."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

import gateway.jobs.video as video_jobs
from deploy.videos import Scene, make_video
from gateway.errors import ServerSideError
from gateway.http.app import create_app
from gateway.http.providers import services_of
from gateway.settings import Settings
from shaping.video import cut_video
from tests.processes import poll_async
from tests.video.test_video_jobs import job_body

# 12 different one-second shots: 12 distinct frames, two chunks of 8 and 4
SHOTS = [Scene("block:violence" if seed % 3 == 0 else "allow", 1, seed=seed) for seed in range(12)]


class FailsOnce:
    """The moderation service's ``moderate``, whose second call fails once (an engine outage mid-video)."""

    def __init__(self, moderate: Any) -> None:
        self.moderate = moderate
        self.calls = 0
        self.frames_asked = 0
        self.first_answered: asyncio.Event | None = None  # made on the app's loop

    async def __call__(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.first_answered is None:
            self.first_answered = asyncio.Event()
        if self.calls == 2:
            await asyncio.wait_for(self.first_answered.wait(), 20)  # the first chunk is answered first
            raise ServerSideError("the engine went away", code="engine_unavailable")
        self.frames_asked += len(request.input)
        try:
            return await self.moderate(request, *args, **kwargs)
        finally:
            self.first_answered.set()


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_a_retried_video_job_leaves_one_decision_row_per_frame_and_asks_no_frame_twice(
    sim: Any, redis_url: str, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuts: list[object] = []

    def counted_cut(source: object, *args: Any, **kwargs: Any) -> Any:
        cuts.append(source)
        return cut_video(source, *args, **kwargs)

    monkeypatch.setattr(video_jobs, "cut_video", counted_cut)
    since = datetime.datetime.now(datetime.UTC)
    redis = {"url": redis_url} if store == "redis" else {}
    settings = Settings(engine={"url": sim.url}, jobs={"retry_wait_s": 0.05}, redis=redis)
    app = create_app(settings)
    async with AsyncTestClient(app, timeout=30) as client:
        moderation = services_of(app).moderation
        failing = FailsOnce(moderation.moderate)
        moderation.moderate = failing
        accepted = await client.post("/v1/jobs", json=job_body("retried-1", make_video(SHOTS, fps=2)))
        assert accepted.status_code == 202, accepted.text

        async def done() -> Any:
            job = (await client.get(f"/v1/jobs/{accepted.json()['id']}")).json()
            return job if job["status"] in ("succeeded", "failed") else None

        job = await poll_async(done, 30, "the video job to finish")
        # the decision log lives on the app's own event loop (a Redis client is bound to it)
        rows = (await asyncio.to_thread(client.blocking_portal.call, moderation.decisions.live, since)).rows
        store = services_of(app).jobs.store
        kept = await asyncio.to_thread(client.blocking_portal.call, store.parts, accepted.json()["id"])
        kept_cut = await asyncio.to_thread(client.blocking_portal.call, store.cut, accepted.json()["id"])
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 2
    assert job["result"]["coverage"]["sent"] == 12
    ours = {frame["modgate"]["decision_id"] for frame in job["result"]["frames"]}
    assert len(ours) == 12  # a stable id per judged frame (a look-alike carries its frame's)
    logged = [row.decision_id for row in rows if row.decision_id in ours]
    assert sorted(logged) == sorted(ours)  # one row per judged frame, none twice
    assert failing.frames_asked == 12  # the first chunk's 8 were not asked again
    assert kept == {}  # the chunks kept for a retry are dropped once the job has finished
    assert len(cuts) == 1  # the retry judged the cut the first attempt kept
    assert kept_cut is None  # dropped with the chunks
