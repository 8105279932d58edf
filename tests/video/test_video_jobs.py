"""A video posted as a job: its keyframes cut, judged, merged into segments; bad videos refused clearly."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.videos import Scene, make_video
from tests.processes import poll_async
from tests.reliability.conftest import error_body
from tests.support import GatewayFactory, data_url

VIOLENT_MIDDLE = [Scene("allow", 3, seed=1), Scene("block:violence", 3, seed=2), Scene("allow", 3, seed=3)]


def video_url(video: bytes) -> str:
    """A ``data:video/mp4`` URL."""
    return f"data:video/mp4;base64,{base64.b64encode(video).decode()}"


def job_body(video_id: str, video: bytes) -> dict[str, Any]:
    """A video job's body with the video as a data: URL."""
    return {"video_id": video_id, "video": {"url": video_url(video)}}


async def finished(client: httpx.AsyncClient, job_id: str, timeout_s: float = 60) -> Any:
    """Poll the job until it has succeeded or failed."""

    async def done() -> Any:
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        return job if job["status"] in ("succeeded", "failed") else None

    return await poll_async(done, timeout_s, f"job {job_id} to finish")


@pytest.fixture(scope="module")
def violent_video() -> bytes:
    """9 s of H.264: allow, a violent scene from 3 s to 6 s, allow."""
    return make_video(VIOLENT_MIDDLE)


async def test_a_video_with_a_violent_middle_comes_back_as_allow_block_allow_segments(
    gateway: ThreadedServer, violent_video: bytes
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=job_body("clip-1", violent_video))
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["frames"] == 0
        job = await finished(client, accepted.json()["id"])
    assert job["status"] == "succeeded", job
    result = job["result"]
    assert [f["timestamp_ms"] for f in result["frames"]] == list(range(0, 9000, 1000))
    shape = [(s["action"], s["categories"], s["start_ms"], s["end_ms"]) for s in result["segments"]]
    assert shape == [("allow", [], 0, 3000), ("block", ["violence"], 3000, 6000), ("allow", [], 6000, 9000)]
    assert result["segments"][1]["frames"] == [3, 4, 5]
    confidences = [result["frames"][i]["modgate"]["confidence"] for i in (3, 4, 5)]
    assert result["segments"][1]["confidence"] == min(confidences)
    assert result["duration_ms"] == 9000
    assert result["verdict"]["action"] == "block"
    assert job["progress"] == {"frames_done": 9, "frames_total": 9}
    assert job["frames"] == 9


async def test_more_distinct_frames_than_max_frames_fail_the_job_unless_a_sparser_sample_is_asked(
    gateway: ThreadedServer, violent_video: bytes
) -> None:
    strict = {"video_id": "clip-2", "video": {"url": video_url(violent_video)}, "sampling": {"max_frames": 2}}
    sparse = {**strict, "sampling": {"max_frames": 2, "allow_sparser": True}}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        failed = await finished(client, (await client.post("/v1/jobs", json=strict)).json()["id"])
        thinned = await finished(client, (await client.post("/v1/jobs", json=sparse)).json()["id"])
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "video_too_many_frames"
    coverage = thinned["result"]["coverage"]
    assert (coverage["sent"], coverage["complete"]) == (2, False)
    assert coverage["max_gap_ms"] > 1000


async def test_a_still_shot_costs_one_engine_call_and_the_result_says_its_coverage(
    gateway: ThreadedServer, violent_video: bytes
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=job_body("clip-2b", violent_video))
        job = await finished(client, accepted.json()["id"])
    coverage = job["result"]["coverage"]
    assert coverage == {"max_gap_ms": 750, "frames_decoded": 36, "candidates": 9, "sent": 3, "reused": 6,
                        "complete": True}
    assert [f["modgate"]["reused"] for f in job["result"]["frames"][:3]] == [None, "near", "near"]


async def test_a_truncated_mp4_is_refused_at_submission(
    gateway: ThreadedServer, violent_video: bytes
) -> None:
    truncated = violent_video[: len(violent_video) // 2]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answer = await client.post("/v1/jobs", json=job_body("clip-3", truncated))
    assert answer.status_code == 422, answer.text
    error = error_body(answer)
    assert (error["code"], error["param"]) == ("video_decode_failed", "video")


async def test_a_jpeg_sent_as_a_video_gets_a_415_that_says_it_is_a_still(gateway: ThreadedServer) -> None:
    jpeg = make_keyframe("allow", 320, 180, seed=1)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answer = await client.post("/v1/jobs", json=job_body("clip-4", jpeg))
    assert answer.status_code == 415, answer.text
    error = error_body(answer)
    assert error["code"] == "unsupported_video_codec"
    assert "still image" in error["message"]


async def test_frames_and_a_video_together_get_a_400(gateway: ThreadedServer, violent_video: bytes) -> None:
    body = {"video_id": "clip-5", "video": {"url": video_url(violent_video)},
            "frames": [{"image_url": {"url": data_url(make_keyframe("allow", 64, 64))}}]}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        both = await client.post("/v1/jobs", json=body)
        neither = await client.post("/v1/jobs", json={"video_id": "clip-5"})
    assert (both.status_code, neither.status_code) == (400, 400)
    assert "either frames or a video" in error_body(both)["message"]


@pytest.mark.parametrize(
    ("videos", "code"),
    [({"max_duration_s": 5}, "video_too_long"), ({"max_pixels": 320 * 100}, "video_too_large"),
     ({"max_bytes": 100_000}, "video_too_large")],
)
async def test_a_video_over_a_limit_gets_a_413_naming_it(
    start_gateway: GatewayFactory,
    sim: ThreadedServer,
    violent_video: bytes,
    videos: dict[str, Any],
    code: str,
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, videos=videos)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answer = await client.post("/v1/jobs", json=job_body("clip-6", violent_video))
    assert answer.status_code == 413, answer.text
    assert error_body(answer)["code"] == code


async def test_a_video_cut_past_its_budget_fails_the_job_saying_so(
    start_gateway: GatewayFactory, sim: ThreadedServer, violent_video: bytes
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, videos={"cut_budget_s": 1e-9})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=job_body("clip-7", violent_video))
        job = await finished(client, accepted.json()["id"])
    assert job["status"] == "failed"
    assert job["error"]["code"] == "video_cut_timeout"
    assert "not cut within" in job["error"]["message"]


@pytest.mark.parametrize("part_type", ["video/mp4", "video/*"])  # a range, as OpenAPI's encoding names it
async def test_a_multipart_video_job_is_cut_and_judged(
    gateway: ThreadedServer, violent_video: bytes, part_type: str
) -> None:
    files = {"video": ("clip.mp4", violent_video, part_type),
             "job": (None, '{"video_id": "clip-8", "sampling": {"max_fps": 1.0}}', "application/json")}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", files=files)
        assert accepted.status_code == 202, accepted.text
        job = await finished(client, accepted.json()["id"])
    assert job["status"] == "succeeded", job
    assert [s["action"] for s in job["result"]["segments"]] == ["allow", "block", "allow"]


async def test_a_multipart_job_without_its_video_part_gets_a_400(gateway: ThreadedServer) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        files = {"job": (None, '{"video_id": "clip-9"}', "application/json")}
        answer = await client.post("/v1/jobs", files=files)
    assert answer.status_code == 400
    assert error_body(answer)["param"] == "video"


async def test_a_multipart_part_besides_video_and_job_gets_a_400_naming_it(
    gateway: ThreadedServer, violent_video: bytes
) -> None:
    """A field sent as its own part (here the video's id) is refused, not dropped: it belongs in 'job'."""
    files = {"video": ("clip.mp4", violent_video, "video/mp4"),
             "job": (None, '{"video_id": "clip-10"}', "application/json"),
             "video_id": (None, "clip-11")}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        answer = await client.post("/v1/jobs", files=files)
        assert answer.status_code == 400, answer.text
        assert error_body(answer)["param"] == "video_id"
        assert "'job' part" in error_body(answer)["message"]
