"""``POST /v1/videos/{video_id}/keyframes``: a verdict per frame and for the video, K frames per call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.support import GatewayFactory, SimFactory, data_url, forward, image_input


@pytest.fixture
def sim(start_sim: SimFactory) -> ThreadedServer:
    """The instant simulator, with no thinking-off flips: these tests are about batches, not disagreement."""
    return start_sim(thinking_off_disagreement=0.0)


def frames_body(*frames: bytes, **extra: Any) -> dict[str, Any]:
    parts = [{"image_url": {"url": data_url(f)}, "timestamp_ms": 1000 * i} for i, f in enumerate(frames)]
    return {"frames": parts, **extra}


def post_batch(
    gateway: ThreadedServer,
    body: dict[str, Any],
    video_id: str = "video-1",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/videos/{video_id}/keyframes",
        json=body,
        timeout=60,
        headers={"X-Modgate-Thinking": "off", **(headers or {})},
    )


def engine_counter(engine: ThreadedServer, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{engine.url}/metrics", timeout=10).text):
        if family.name == name:
            return sum(sample.value for sample in family.samples)
    raise AssertionError(f"no {name} on the engine")


LABELS = ("allow", "review", "block:violence", "allow", "block:hate")
FRAMES = [make_keyframe(label, 640, 360, seed=40 + i) for i, label in enumerate(LABELS)]
EXPECTED = ["allow", "review", "block", "allow", "block"]


def test_each_frame_gets_its_verdict_and_the_video_the_worst(gateway: ThreadedServer) -> None:
    response = post_batch(gateway, frames_body(*FRAMES))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "video.keyframes.moderation"
    assert answer["video_id"] == "video-1"
    assert [f["modgate"]["action"] for f in answer["frames"]] == EXPECTED
    assert [f["index"] for f in answer["frames"]] == [0, 1, 2, 3, 4]
    assert [f["timestamp_ms"] for f in answer["frames"]] == [0, 1000, 2000, 3000, 4000]
    assert answer["frames"][2]["categories"]["violence"] is True
    verdict = answer["verdict"]
    assert verdict == {
        "action": "block",
        "flagged": True,
        "categories": ["hate", "violence"],
        "blocked_frames": [2, 4],
        "review_frames": [1],
    }
    assert answer["packing"] == 1
    assert answer["engine_requests"] == 5
    assert answer["reused_frames"] == 0


def test_a_frames_result_is_its_position_then_a_moderation_results_fields_in_their_wire_order(
    gateway: ThreadedServer,
) -> None:
    frame = post_batch(gateway, frames_body(FRAMES[0])).json()["frames"][0]
    result = httpx.post(
        f"{gateway.url}/v1/moderations",
        json={"input": image_input(FRAMES[0])},
        timeout=60,
        headers={"X-Modgate-Thinking": "off"},
    ).json()["results"][0]
    fields = ["flagged", "categories", "category_scores", "category_applied_input_types", "modgate"]
    assert list(result) == fields
    assert list(frame) == ["index", "timestamp_ms", *fields]
    assert list(frame["modgate"]) == list(result["modgate"])
    assert frame["modgate"]["escalated_from"] is None  # null fields are sent, not left out


@pytest.mark.parametrize(
    ("labels", "action"), [(("allow", "review"), "review"), (("allow", "allow"), "allow")]
)
def test_the_video_is_reviewed_or_allowed_by_its_frames(
    gateway: ThreadedServer, labels: tuple[str, ...], action: str
) -> None:
    frames = [make_keyframe(label, 640, 360, seed=60 + i) for i, label in enumerate(labels)]
    verdict = post_batch(gateway, frames_body(*frames)).json()["verdict"]
    assert verdict["action"] == action
    assert verdict["flagged"] is (action != "allow")


def test_packed_frames_take_fewer_engine_requests_with_the_same_verdicts(
    sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    before = engine_counter(sim, "vllm:request_success")
    answer = post_batch(gateway, frames_body(*FRAMES, packing=2)).json()
    assert engine_counter(sim, "vllm:request_success") - before == 3  # 2 + 2 + 1
    assert answer["packing"] == 2
    assert answer["engine_requests"] == 3
    assert [f["modgate"]["action"] for f in answer["frames"]] == EXPECTED
    ids = [f["modgate"]["request_id"] for f in answer["frames"]]
    assert ids[0] == ids[1] != ids[2] == ids[3] != ids[4]


def test_packed_frames_share_the_engines_tokens_without_losing_any(
    sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    before = engine_counter(sim, "vllm:prompt_tokens")
    answer = post_batch(gateway, frames_body(*FRAMES[:3], packing=3)).json()
    engine_tokens = engine_counter(sim, "vllm:prompt_tokens") - before
    shares = [f["modgate"]["prompt_tokens"] for f in answer["frames"]]
    assert sum(shares) == engine_tokens
    assert max(shares) - min(shares) <= 1


def test_the_packing_setting_applies_to_moderations_too(
    sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine_url=sim.url, shaping={"packing_k": 4})
    before = engine_counter(sim, "vllm:request_success")
    response = httpx.post(
        f"{gateway.url}/v1/moderations",
        json={"model": "m", "input": image_input(*FRAMES)},
        timeout=60,
        headers={"X-Modgate-Thinking": "off"},
    )
    assert response.status_code == 200, response.text
    assert engine_counter(sim, "vllm:request_success") - before == 2
    actions = [r["modgate"]["action"] for r in response.json()["results"]]
    assert actions == EXPECTED


def test_repeated_frames_of_a_video_are_judged_once(
    sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    scene = make_keyframe("allow", 1280, 720, seed=70)
    reencoded = make_keyframe("allow", 1280, 720, seed=70, quality=70)
    answer = post_batch(gateway, frames_body(scene, scene, reencoded, FRAMES[2])).json()
    assert [f["modgate"]["reused"] for f in answer["frames"]] == [None, "exact", "near", None]
    assert answer["engine_requests"] == 2
    assert answer["reused_frames"] == 2
    assert answer["frames"][2]["modgate"]["request_id"] == answer["frames"][0]["modgate"]["request_id"]


def test_an_unusable_packed_answer_sends_every_frame_of_it_to_review(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    engine = start_sim("instant", faults=Faults(malformed_rate=1.0))
    gateway = start_gateway(engine_url=engine.url)
    answer = post_batch(gateway, frames_body(*FRAMES[:4], packing=2)).json()
    assert [f["modgate"]["action"] for f in answer["frames"]] == ["review"] * 4
    assert all(f["modgate"]["reason"] for f in answer["frames"])
    assert answer["verdict"]["action"] == "review"


def test_the_thinking_mode_can_be_asked_in_the_body(gateway: ThreadedServer) -> None:
    answer = post_batch(gateway, frames_body(FRAMES[0], thinking="on"), headers={"X-Modgate-Thinking": "on"})
    details = answer.json()["frames"][0]["modgate"]
    assert details["thinking"] == "on"
    assert details["reasoning_tokens"] > 0


@pytest.mark.parametrize(
    ("body", "video_id", "param"),
    [
        ({"frames": []}, "video-1", "frames"),
        (frames_body(FRAMES[0], packing=0), "video-1", "packing"),
        (frames_body(FRAMES[0], colour="red"), "video-1", "colour"),
        (frames_body(FRAMES[0]), "video one", "video_id"),
        ({"frames": [{"image_url": {"url": "data:image/jpeg;base64,bm90IGEganBlZw=="}}]}, "video-1", "input"),
    ],
)
def test_a_bad_batch_gets_a_4xx_in_the_openai_error_shape(
    gateway: ThreadedServer, body: dict[str, Any], video_id: str, param: str
) -> None:
    response = post_batch(gateway, body, video_id=video_id)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert param in json.dumps(error)


def test_a_batch_over_the_frame_limit_is_refused(sim: ThreadedServer, start_gateway: GatewayFactory) -> None:
    gateway = start_gateway(engine_url=sim.url, shaping={"max_frames_per_batch": 2})
    response = post_batch(gateway, frames_body(*FRAMES[:3]))
    assert response.status_code == 400
    assert "at most 2 frames" in response.json()["error"]["message"]


@pytest.fixture
def recorded_engine(sim: ThreadedServer) -> Iterator[tuple[ThreadedServer, list[set[str]]]]:
    """A gateway with two tenants whose engine traffic is recorded: each chat request's image uuids."""
    seen: list[set[str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            body = json.loads(request.content)
            parts = body["messages"][1]["content"]
            seen.append({part["uuid"] for part in parts if part["type"] == "image_url"})
        return await forward(request, sim.url)

    settings = Settings(
        api_keys="k-a:tenant-a,k-b:tenant-b",
        shaping={"packing_k": 4},  # type: ignore[arg-type]  # pydantic builds the group from a dict
    )
    with ThreadedServer(create_app(settings, engine_transport=httpx.MockTransport(handler))) as gateway:
        yield gateway, seen


def test_frames_of_different_tenants_are_never_packed_together(
    recorded_engine: tuple[ThreadedServer, list[set[str]]],
) -> None:
    gateway, seen = recorded_engine
    tenant_frames = {
        "k-a": [make_keyframe("allow", 640, 360, seed=80 + i) for i in range(3)],
        "k-b": [make_keyframe("allow", 640, 360, seed=90 + i) for i in range(3)],
    }

    async def post_all() -> dict[str, set[str]]:
        async with httpx.AsyncClient(timeout=60) as http:

            async def one(key: str, frames: list[bytes]) -> set[str]:
                response = await http.post(
                    f"{gateway.url}/v1/videos/v/keyframes",
                    json=frames_body(*frames),
                    headers={"Authorization": f"Bearer {key}"},
                )
                assert response.status_code == 200, response.text
                return {f["modgate"]["frame_sha256"] for f in response.json()["frames"]}

            found = await asyncio.gather(*(one(key, frames) for key, frames in tenant_frames.items()))
            return dict(zip(tenant_frames, found, strict=True))

    shas = asyncio.run(post_all())
    assert len(seen) == 2  # three frames of each tenant, packed four to a request
    for uuids in seen:
        assert uuids <= shas["k-a"] or uuids <= shas["k-b"]
