"""Limits on what is decoded: measured duration, pixels per decoded frame, damage, the probe's own threads."""

from __future__ import annotations

import asyncio
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.evasive_videos import encode, held, size_change
from deploy.keyframes import render_keyframe
from gateway.errors import Overloaded
from gateway.jobs.models import JobRequest
from gateway.jobs.video import VideoJobs
from gateway.settings import JobSettings, VideoSettings
from tests.reliability.conftest import error_body
from tests.support import GatewayFactory
from tests.video.test_video_jobs import finished, job_body, video_url

CALM, VIOLENT = render_keyframe("allow", 160, 90, 1), render_keyframe("block:violence", 160, 90, 2)


def live_matroska(seconds: float) -> bytes:
    """Matroska as a browser records it live: no duration in its header."""
    return encode(held(CALM, 0, seconds, 2), size=(160, 90), container="matroska",
                  container_options={"live": "1"})


async def submit(gateway: ThreadedServer, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        return await client.post("/v1/jobs", json=body)


async def test_a_live_matroska_without_a_duration_is_measured_and_refused_at_submission(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, videos={"max_duration_s": 5})
    answer = await submit(gateway, job_body("live-1", live_matroska(20)))
    assert answer.status_code == 413, answer.text
    assert error_body(answer)["code"] == "video_too_long"


async def test_a_mid_stream_size_change_over_the_pixel_limit_fails_the_job(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    big = render_keyframe("allow", 640, 360, 3)
    video = size_change(held(CALM, 0, 2, 5), held(big, 2000, 2, 5), (160, 90), (640, 360))
    gateway = start_gateway(engine={"url": sim.url}, videos={"max_pixels": 320 * 180})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=job_body("ts-1", video))
        assert accepted.status_code == 202, accepted.text  # its header says 160x90
        job = await finished(client, accepted.json()["id"])
    assert (job["status"], job["error"]["code"]) == ("failed", "video_too_large")
    assert "640x360" in job["error"]["message"]


async def test_the_first_half_of_a_faststart_mp4_is_never_an_allow(gateway: ThreadedServer) -> None:
    whole = encode(held(CALM, 0, 4, 5) + held(VIOLENT, 4000, 4, 5), size=(160, 90),
                   container_options={"movflags": "+faststart"})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=job_body("half-1", whole[: len(whole) // 2]))
        if accepted.status_code == 202:
            job = await finished(client, accepted.json()["id"])
            assert (job["status"], job["error"]["code"]) == ("failed", "video_decode_failed"), job
        else:
            assert error_body(accepted)["code"] == "video_decode_failed"


def blocked_pool() -> tuple[ThreadPoolExecutor, threading.Event]:
    """A one-thread pool whose thread waits until the event is set."""
    pool, release = ThreadPoolExecutor(1), threading.Event()
    pool.submit(release.wait, 30)
    return pool, release


async def test_the_submission_probe_never_waits_behind_a_cut(tmp_path: Path) -> None:
    cuts, release = blocked_pool()
    probes = ThreadPoolExecutor(1)
    videos = VideoJobs(VideoSettings(spool_dir=tmp_path), JobSettings(), cuts, probes=probes)
    request = JobRequest(video_id="p", video={"url": video_url(live_matroska(2))})
    try:
        await asyncio.wait_for(videos.check(request, "job_p"), timeout=10)  # the cut thread is held all along
    finally:
        release.set()
        cuts.shutdown()
        probes.shutdown()


async def test_a_submission_gets_a_429_with_retry_after_when_every_probe_is_busy(tmp_path: Path) -> None:
    probes, release = blocked_pool()
    videos = VideoJobs(VideoSettings(spool_dir=tmp_path), JobSettings(), ThreadPoolExecutor(1), probes=probes)
    request = JobRequest(video_id="p", video={"url": video_url(live_matroska(2))})
    probing = 2 * videos.settings.probe_workers  # as many waiting as running: the door is full
    waiting = [asyncio.create_task(videos.check(request, f"job_{n}")) for n in range(probing)]
    await asyncio.sleep(0.1)
    try:
        with pytest.raises(Overloaded) as refused:
            await videos.check(request, "job_last")
        assert refused.value.headers()["Retry-After"] == "1"
    finally:
        release.set()
        await asyncio.gather(*waiting)
        probes.shutdown()


async def test_a_one_picture_gif_sent_as_a_video_gets_a_415_that_says_it_is_a_still(
    gateway: ThreadedServer,
) -> None:
    gif = io.BytesIO()
    CALM.save(gif, "GIF")
    answer = await submit(gateway, job_body("gif-1", gif.getvalue()))
    assert answer.status_code == 415, answer.text
    assert "still image" in error_body(answer)["message"]
