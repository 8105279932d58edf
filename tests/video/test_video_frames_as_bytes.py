"""A video job's cut frames go to moderation as their JPEG bytes, shaped already where they were decoded: no
``data:`` URL is written and decoded, and shaping passes them through as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

import gateway.moderation.frame_input as frame_input
import gateway.moderation.service as moderation_service
from cli.embedded import ThreadedServer
from deploy.videos import make_video
from shaping.image import decode_data_url
from tests.video.test_video_jobs import VIOLENT_MIDDLE, finished, job_body


async def test_a_video_jobs_cut_frames_are_shaped_from_their_bytes_and_no_data_url_is_decoded(
    gateway: ThreadedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[str] = []
    shaped: list[Any] = []
    decode: Callable[[str, int], tuple[str, bytes]] = decode_data_url
    shape = frame_input.shape_frame

    def counting_decode(url: str, max_bytes: int) -> tuple[str, bytes]:
        decoded.append(url[:32])
        return decode(url, max_bytes)

    async def counting_shape(frame: frame_input.Frame, tenant: str, **kwargs: Any) -> Any:
        result = await shape(frame, tenant, **kwargs)
        shaped.append((frame, result))
        return result

    monkeypatch.setattr(frame_input, "decode_data_url", counting_decode)
    monkeypatch.setattr(moderation_service, "shape_frame", counting_shape)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", json=job_body("clip-bytes", make_video(VIOLENT_MIDDLE)))
        job = await finished(client, accepted.json()["id"])
    assert job["status"] == "succeeded", job
    assert decoded == []
    assert len(shaped) == job["result"]["coverage"]["sent"] > 0
    assert all(isinstance(frame, frame_input.EncodedFrame) for frame, _ in shaped)
    assert all(frame.data[:3] == b"\xff\xd8\xff" for frame, _ in shaped)  # the cut's JPEGs, as they were
    # on the token grid already: passed through (their bitstream sent as it is), not decoded and resized
    assert all(result.passthrough and result.data == frame.data for frame, result in shaped)
    assert [segment["action"] for segment in job["result"]["segments"]] == ["allow", "block", "allow"]
