"""Encodings an uploader picks to hide a scene: each evasive video's harmful seconds come back blocked."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.evasive_videos import EvasiveVideo, corpus
from tests.video.test_video_jobs import finished, job_body

MAX_GAP_MS = 1000  # MODGATE_VIDEOS__MAX_GAP_S's default


@pytest.fixture(scope="module")
def evasive() -> list[EvasiveVideo]:
    """The benchmark's corpus, small: 320x180 at 10 fps, about 12 s each."""
    return corpus()


def blocked_ranges(result: dict[str, Any]) -> list[tuple[int, int]]:
    """The result's block segments as (start, end) ms, neighbours joined."""
    ranges: list[tuple[int, int]] = []
    for segment in result["segments"]:
        if segment["action"] != "block":
            continue
        if ranges and ranges[-1][1] == segment["start_ms"]:
            ranges[-1] = (ranges[-1][0], segment["end_ms"])
        else:
            ranges.append((segment["start_ms"], segment["end_ms"]))
    return ranges


@pytest.mark.parametrize("number", range(8))
async def test_each_evasive_videos_harmful_seconds_come_back_as_block_segments_within_one_gap(
    gateway: ThreadedServer, evasive: list[EvasiveVideo], number: int
) -> None:
    video = evasive[number]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=job_body(f"evasive-{number}", video.data))
        assert accepted.status_code == 202, accepted.text
        job = await finished(client, accepted.json()["id"])
    assert job["status"] == "succeeded", (video.name, job)
    blocked = blocked_ranges(job["result"])
    assert len(blocked) == len(video.harmful), (video.name, blocked)
    for (start, end), (want_start, want_end) in zip(blocked, video.harmful, strict=True):
        assert abs(start - want_start) <= MAX_GAP_MS, (video.name, blocked)
        assert abs(end - want_end) <= MAX_GAP_MS, (video.name, blocked)
    assert job["result"]["coverage"]["max_gap_ms"] <= MAX_GAP_MS
    assert job["result"]["engine_requests"] <= 2 * len(video.harmful) + 2  # a few calls per shot
