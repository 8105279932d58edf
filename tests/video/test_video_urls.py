"""A video URL is fetched as image URLs are: the allowlist, public addresses only, the size capped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from litestar.testing import AsyncTestClient

from deploy.videos import Scene, make_video
from gateway.http.app import create_app
from gateway.http.providers import services_of
from gateway.moderation.remote_images import VIDEOS
from gateway.settings import Settings
from tests.processes import poll_async
from tests.reliability.test_remote_images import PUBLIC, FakeDns, Origin, fetcher

CLIP = make_video([Scene("allow", 1, seed=1), Scene("block:sexual", 1, seed=2)])
REMOTE = {"enabled": True, "allowlist": ["cdn.example.com"]}


async def serve_clip(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=CLIP, headers={"content-type": "video/mp4"})


async def job_for(client: Any, url: str) -> Any:
    """Submit a video job for ``url`` and poll it to its end."""
    accepted = await client.post("/v1/jobs", json={"video_id": "remote-1", "video": {"url": url}})
    assert accepted.status_code == 202, accepted.text

    async def done() -> Any:
        job = (await client.get(f"/v1/jobs/{accepted.json()['id']}")).json()
        return job if job["status"] in ("succeeded", "failed") else None

    return await poll_async(done, 30, "the video job to finish")


async def test_a_fetched_video_is_cut_and_judged(sim: Any, tmp_path: Path) -> None:
    """Fetched into the spool (never whole in memory), cut from there, and deleted once cut."""
    app = create_app(Settings(engine={"url": sim.url}, remote_images=REMOTE,
                              videos={"spool_dir": str(tmp_path)}))
    async with AsyncTestClient(app, timeout=30) as client:
        # The network is faked (a public address, an origin in memory); the gateway path is real.
        services_of(app).jobs.videos.fetcher = fetcher(
            FakeDns({"cdn.example.com": [PUBLIC]}), Origin(serve_clip)
        )
        job = await job_for(client, "https://cdn.example.com/clip.mp4")
    assert job["status"] == "succeeded", job
    assert [s["action"] for s in job["result"]["segments"]] == ["allow", "block"]
    assert list(tmp_path.iterdir()) == []


async def test_a_video_over_the_size_cap_fails_the_job_while_streaming(sim: Any, tmp_path: Path) -> None:
    app = create_app(Settings(engine={"url": sim.url}, remote_images=REMOTE,
                              videos={"spool_dir": str(tmp_path)}))
    async with AsyncTestClient(app, timeout=30) as client:
        services_of(app).jobs.videos.fetcher = fetcher(
            FakeDns({"cdn.example.com": [PUBLIC]}), Origin(serve_clip), max_bytes=len(CLIP) // 2, what=VIDEOS
        )
        job = await job_for(client, "https://cdn.example.com/clip.mp4")
    assert job["status"] == "failed"
    assert job["error"]["code"] == "video_too_large"
    assert job["error"]["message"].startswith("the remote video is ")
    assert list(tmp_path.iterdir()) == []  # the part fetched is deleted


async def test_a_video_host_off_the_allowlist_gets_a_403_at_submission(sim: Any) -> None:
    app = create_app(Settings(engine={"url": sim.url}, remote_images=REMOTE))
    async with AsyncTestClient(app, timeout=30) as client:
        body = {"video_id": "r", "video": {"url": "https://evil.example.net/v"}}
        answer = await client.post("/v1/jobs", json=body)
    assert answer.status_code == 403  # listed in the document: a URL it allows is never a 400
    error = answer.json()["error"]
    assert error["code"] == "video_url_refused"
    assert (error["param"], error["message"]) == (
        "video.url", "the host 'evil.example.net' is not on the allowlist (MODGATE_REMOTE_IMAGES__ALLOWLIST)"
    )


async def test_a_video_url_without_remote_fetching_gets_a_400(sim: Any) -> None:
    app = create_app(Settings(engine={"url": sim.url}))
    async with AsyncTestClient(app, timeout=30) as client:
        body = {"video_id": "r", "video": {"url": "https://cdn.example.com/v"}}
        answer = await client.post("/v1/jobs", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_data_url"
