"""One batch shape: ``POST /v1/jobs`` takes the body of ``POST /v1/videos/{id}/keyframes`` and its result
is the document the sync call answers (packing, reuse inside the batch, the video's verdict, timestamps)."""

from __future__ import annotations

from typing import Any

import httpx

from deploy.keyframes import make_keyframe
from tests.reliability.test_jobs import finished
from tests.support import GatewayFactory, SimFactory, data_url, image_input

ALLOW = make_keyframe("allow", 320, 180, seed=41)
VIOLENT = make_keyframe("block:violence", 320, 180, seed=42)
BATCH: dict[str, Any] = {
    "frames": [
        {"image_url": {"url": data_url(ALLOW)}, "timestamp_ms": 0},
        {"image_url": {"url": data_url(VIOLENT)}, "timestamp_ms": 2000},
        {"image_url": {"url": data_url(ALLOW)}, "timestamp_ms": 4000},  # a repeat: judged once
    ],
    "packing": 2,
    "thinking": "off",
}
# What differs between two runs of the same frames: ids and timings, nothing a caller decides on.
VARYING = {"latency_ms", "queue_ms", "shaping_ms", "ttft_ms", "decode_ms", "request_id", "decision_id"}


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The document without its id and each frame's timings, engine request id and decision id (each
    verdict's own: the job's frames are decisions of their own)."""
    frames = [
        {**frame, "modgate": {k: v for k, v in frame["modgate"].items() if k not in VARYING}}
        for frame in document["frames"]
    ]
    return {**{k: v for k, v in document.items() if k != "id"}, "frames": frames}


async def test_the_same_frames_sync_and_as_a_job_give_the_same_document(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim()
    # No reuse across the two runs (each must ask the engine), so both see the same engine work.
    gateway = start_gateway(engine={"url": sim.url}, shaping={"verdict_cache_ttl_s": 0})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
        sync = await client.post("/v1/videos/video-7/keyframes", json=BATCH)
        assert sync.status_code == 200, sync.text
        await client.post(f"{sim.url}/sim/reset_prefix_cache")  # the same cache state for the second run
        accepted = await client.post("/v1/jobs", json={**BATCH, "video_id": "video-7"})
        assert accepted.status_code == 202, accepted.text
        job = await finished(client, accepted.json()["id"])
    assert job["status"] == "succeeded", job
    result = job["result"]
    assert result["object"] == "video.keyframes.moderation"
    assert result["verdict"]["action"] == "block"
    assert [f["timestamp_ms"] for f in result["frames"]] == [0, 2000, 4000]
    assert (result["engine_requests"], result["reused_frames"], result["packing"]) == (1, 1, 2)
    assert comparable(result) == comparable(sync.json())


async def test_the_earlier_content_part_job_body_is_still_accepted(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": start_sim().url})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
        old_body = {"video_id": "v1", "frames": image_input(ALLOW, VIOLENT)}  # OpenAI content parts
        accepted = await client.post("/v1/jobs", json=old_body)
        assert accepted.status_code == 202, accepted.text
        job = await finished(client, accepted.json()["id"])
    result = job["result"]
    assert [f["modgate"]["action"] for f in result["frames"]] == ["allow", "block"]
    assert [f["timestamp_ms"] for f in result["frames"]] == [None, None]
    assert result["verdict"]["blocked_frames"] == [1]


async def test_a_job_follows_the_sync_calls_rules_for_its_body(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": start_sim().url})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
        bad_id = await client.post("/v1/jobs", json={**BATCH, "video_id": "a video/with spaces"})
        sync_bad_id = await client.post("/v1/videos/a%20video/keyframes", json=BATCH)
        bad_packing = await client.post("/v1/jobs", json={**BATCH, "video_id": "v", "packing": 99})
    assert (bad_id.status_code, bad_id.json()["error"]["param"]) == (400, "video_id")
    assert sync_bad_id.status_code == 400
    assert bad_packing.status_code == 400
