"""``/metrics`` carries the job and video series an operator needs (jobs by kind and status, failures by code,
the cut, frames by stage, the gap), and a job's requests are counted under it, not as live calls."""

from __future__ import annotations

import httpx

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.videos import Scene, make_video
from tests.support import GatewayFactory, image_input
from tests.telemetry.test_metrics_endpoint import samples, value
from tests.video.test_video_jobs import finished, job_body


async def test_jobs_and_a_cut_video_show_in_the_job_series_and_not_in_the_live_ones(
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
        frames = image_input(*(make_keyframe(label, 320, 180, seed=7) for label in ("allow", "block:hate")))
        posted = await client.post("/v1/jobs", json={"video_id": "k-1", "frames": frames})
        assert (await finished(client, posted.json()["id"]))["status"] == "succeeded"
        live = {"input": image_input(make_keyframe("allow", 320, 180, seed=9))}
        assert (await client.post("/v1/moderations", json=live)).status_code == 200
    families = samples(gateway)

    assert value(families, "modgate_jobs_total", kind="video", status="succeeded") == 1
    assert value(families, "modgate_jobs_total", kind="video", status="failed") == 1
    assert value(families, "modgate_jobs_total", kind="keyframes", status="succeeded") == 1
    assert value(families, "modgate_job_failures_total", kind="video", code="video_too_many_frames") == 1
    assert value(families, "modgate_video_frames_total", stage="decoded") == 16  # the one cut to its end
    assert value(families, "modgate_video_frames_total", stage="sent") == 2
    assert value(families, "modgate_video_cut_seconds_count") == 1
    assert value(families, "modgate_video_coverage_gap_seconds_count") == 1
    # The video's one chunk (its 2 frames sent) and the keyframes job's request: under their jobs.
    assert value(families, "modgate_job_requests_total", kind="video", outcome="ok") == 1
    assert value(families, "modgate_job_requests_total", kind="keyframes", outcome="ok") == 1
    # The live series hold the one live request and its one keyframe, nothing of the jobs'.
    assert value(families, "modgate_requests_total", route="moderations", outcome="ok") == 1
    assert value(families, "modgate_request_seconds_count", outcome="ok") == 1
    assert sum(s.value for s in families["modgate_tenant_request_seconds"] if s.name.endswith("_count")) == 1
    # Yet the jobs' frames are work the gateway did for the tenant: 2 of the video's, 2 posted, 1 live.
    assert sum(s.value for s in families["modgate_tenant_frames"] if s.name.endswith("_total")) == 5
