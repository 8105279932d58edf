"""``/metrics`` carries the video series an operator needs: jobs by status, the cut, frames, the gap."""

from __future__ import annotations

import httpx

from cli.embedded import ThreadedServer
from deploy.videos import Scene, make_video
from tests.support import GatewayFactory
from tests.telemetry.test_metrics_endpoint import samples, value
from tests.video.test_video_jobs import finished, job_body


async def test_a_cut_and_judged_video_and_a_failed_one_show_in_the_video_series(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine={"url": sim.url})
    video = make_video([Scene("allow", 2, seed=1), Scene("block:violence", 2, seed=2)], fps=4)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        good = await client.post("/v1/jobs", json=job_body("m-1", video))
        assert (await finished(client, good.json()["id"]))["status"] == "succeeded"
        strict = {**job_body("m-2", video), "sampling": {"max_frames": 1}}
        bad = await client.post("/v1/jobs", json=strict)
        assert (await finished(client, bad.json()["id"]))["status"] == "failed"
    families = samples(gateway)
    assert value(families, "modgate_video_jobs_total", status="succeeded", code="ok") == 1
    assert value(families, "modgate_video_jobs_total", status="failed", code="video_too_many_frames") == 1
    assert value(families, "modgate_video_frames_total", stage="decoded") == 16  # the one cut to its end
    assert value(families, "modgate_video_frames_total", stage="sent") == 2
    assert value(families, "modgate_video_cut_seconds_count") == 1
    assert value(families, "modgate_video_coverage_gap_seconds_count") == 1
