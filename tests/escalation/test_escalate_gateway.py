"""``escalate`` through the gateway on the simulator: which frames are re-asked, what the answer says,
the cap under load, the re-ask's priority, the quality pairs and the figures."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import Label, make_keyframe
from deploy.simulator.truth import frame_truth
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, forward, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def set_policy(gateway: ThreadedServer, **fields: Any) -> dict[str, Any]:
    """PUT the policy in force with ``fields`` changed."""
    current = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN, timeout=10).json()
    body = {**current, **fields, "reason": "escalation test"}
    response = httpx.put(f"{gateway.url}/admin/thinking-policy", json=body, headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def escalating(threshold: float, **caps: Any) -> dict[str, Any]:
    return {"default_mode": "escalate", "escalation": {"threshold": threshold, **caps}}


async def moderate_all(gateway: ThreadedServer, frames: list[bytes], **headers: str) -> list[dict[str, Any]]:
    """Each frame in its own request, all at once; the ``modgate`` details in order."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/moderations", json={"input": image_input(f)}, headers=headers) for f in frames)
        )
    assert [r.status_code for r in responses] == [200] * len(frames), [r.text for r in responses]
    return [r.json()["results"][0]["modgate"] for r in responses]


def metric(gateway: ThreadedServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@pytest.fixture
def gateway(start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path) -> ThreadedServer:
    return start_gateway(engine={"url": sim.url}, quality={"records_dir": tmp_path / "records"})


def test_a_sure_fast_verdict_answers_thinking_off_and_says_the_mode(gateway: ThreadedServer) -> None:
    set_policy(gateway, **escalating(0.0, always_categories=[]))
    (details,) = asyncio.run(moderate_all(gateway, [make_keyframe("allow", 320, 180, seed=3)]))
    assert (details["thinking"], details["thinking_rule"], details["thinking_mode"]) == (
        "off",
        "default",
        "escalate",
    )
    assert details["escalated_from"] is None
    assert details["escalation_skipped"] is None


def test_an_unsure_verdict_is_answered_with_thinking_on_and_carries_the_fast_one(
    gateway: ThreadedServer,
) -> None:
    set_policy(gateway, **escalating(1.0))  # every confidence is below 1: every frame escalates
    frame = make_keyframe("block:violence", 320, 180, seed=4)
    (details,) = asyncio.run(moderate_all(gateway, [frame]))
    assert (details["thinking"], details["thinking_rule"], details["thinking_mode"]) == (
        "on",
        "escalated",
        "escalate",
    )
    assert details["reasoning_tokens"] > 0
    fast = details["escalated_from"]
    assert fast["why"] == "low_confidence"
    assert fast["threshold"] == 1.0
    assert fast["confidence"] < 1.0
    assert fast["action"] in ("allow", "block")
    assert fast["request_id"] != details["request_id"]
    assert metric(gateway, "modgate_escalations_total", reason="low_confidence") == 1


def test_review_and_always_escalated_categories_escalate_whatever_the_confidence(
    start_gateway: GatewayFactory, start_sim: SimFactory, tmp_path: Path
) -> None:
    # No fast verdict flips (the simulator's thinking-off disagreement, drawn from each shaped frame's hash):
    # the review frame's fast verdict is review, so the rules alone decide what escalates.
    sim = start_sim(thinking_off_disagreement=0.0)
    gateway = start_gateway(engine={"url": sim.url}, quality={"records_dir": tmp_path / "records"})
    set_policy(gateway, **escalating(0.0, always_categories=["sexual/minors"]))
    frames = [make_keyframe(label, 320, 180, seed=5) for label in ("review", "block:sexual/minors", "allow")]
    review, minors, allow = asyncio.run(moderate_all(gateway, frames))
    assert review["escalated_from"]["why"] == "review"
    assert minors["escalated_from"]["why"] == "category"
    assert minors["escalated_from"]["categories"] == ["sexual/minors"]
    assert (minors["thinking"], minors["action"]) == ("on", "block")
    assert allow["escalated_from"] is None
    assert metric(gateway, "modgate_escalations_total", reason="review") == 1
    assert metric(gateway, "modgate_escalations_total", reason="category") == 1


def test_the_cap_answers_the_rest_fast_and_says_so(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine={"url": sim.url})
    set_policy(gateway, **escalating(1.0, max_share=0.25, cap_applies="always"))
    frames = [make_keyframe("allow", 320, 180, seed=100 + i) for i in range(40)]
    results = asyncio.run(moderate_all(gateway, frames))
    escalated = [d for d in results if d["escalated_from"] is not None]
    skipped = [d for d in results if d["escalation_skipped"] is not None]
    assert len(escalated) + len(skipped) == 40
    assert len(escalated) == 10  # (escalated + 1) / (frames + 1) never passes 25 %
    assert {d["escalation_skipped"] for d in skipped} == {"cap_share"}
    assert all(d["thinking"] == "off" for d in skipped)
    assert metric(gateway, "modgate_escalations_skipped_total", reason="cap_share") == 30
    stats = httpx.get(f"{gateway.url}/stats", timeout=10).json()
    assert stats["escalation"] == {"share": 0.25, "escalated": 10, "skipped_by_cap": 30}


def test_under_load_the_cap_holds_and_the_in_flight_cap_is_never_passed(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim("spark", time_scale=0.002, max_num_seqs=64)
    gateway = start_gateway(engine={"url": sim.url, "max_inflight": 4})
    set_policy(gateway, **escalating(1.0, max_share=0.3, cap_applies="under_load"))
    frames = [make_keyframe("allow", 320, 180, seed=200 + i) for i in range(48)]
    results = asyncio.run(moderate_all(gateway, frames))
    info = httpx.get(f"{sim.url}/sim/info", timeout=10).json()
    assert info["peak_running"] <= 4
    escalated = sum(d["escalated_from"] is not None for d in results)
    skipped = [d["escalation_skipped"] for d in results if d["escalation_skipped"]]
    assert skipped, "48 frames on 4 slots queue: the cap must have held some"
    assert set(skipped) == {"cap_share"}
    assert escalated + len(skipped) == 48
    assert escalated <= 0.3 * 48 + 4  # the cap, plus the frames judged before anything queued


def test_without_a_queue_the_under_load_cap_lets_every_unsure_frame_escalate(
    gateway: ThreadedServer,
) -> None:
    set_policy(gateway, **escalating(1.0, max_share=0.1, cap_applies="under_load"))
    for seed in range(5):  # one at a time: nobody ever waits for a slot
        (details,) = asyncio.run(moderate_all(gateway, [make_keyframe("allow", 320, 180, seed=seed)]))
        assert details["escalated_from"] is not None


def test_a_caller_may_ask_for_escalate(gateway: ThreadedServer) -> None:
    set_policy(gateway, escalation={"threshold": 1.0})
    (details,) = asyncio.run(
        moderate_all(
            gateway, [make_keyframe("allow", 320, 180, seed=9)], **{"X-Modgate-Thinking": "escalate"}
        )
    )
    assert (details["thinking_rule"], details["thinking_mode"]) == ("escalated", "escalate")
    bad = httpx.post(
        f"{gateway.url}/v1/moderations",
        json={"input": image_input(make_keyframe("allow", 320, 180))},
        headers={"X-Modgate-Thinking": "maybe"},
        timeout=10,
    )
    assert bad.status_code == 400
    assert "escalate" in bad.json()["error"]["message"]


def test_every_escalation_is_recorded_as_an_escalation_pair(
    start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path
) -> None:
    records_dir = tmp_path / "records"
    gateway = start_gateway(engine={"url": sim.url}, quality={"records_dir": records_dir})
    set_policy(gateway, **escalating(1.0))
    frames = [make_keyframe("allow", 320, 180, seed=300 + i) for i in range(3)]
    results = asyncio.run(moderate_all(gateway, frames))
    gateway.stop()  # drains the background writes
    lines = [
        json.loads(line) for path in records_dir.glob("*.jsonl") for line in path.read_text().splitlines()
    ]
    assert len(lines) == 6
    assert {(r["arm"], r["selection"], r["selection_probability"]) for r in lines} == {
        ("thinking_off", "escalation", 1.0),
        ("thinking_on", "escalation", 1.0),
    }
    fast = {r["frame_sha256"]: r for r in lines if r["arm"] == "thinking_off"}
    for details in results:
        assert fast[details["frame_sha256"]]["confidence"] == details["escalated_from"]["confidence"]


def test_a_reused_thinking_on_verdict_answers_an_escalate_mode_frame(gateway: ThreadedServer) -> None:
    set_policy(gateway, **escalating(1.0))
    frame = make_keyframe("allow", 320, 180, seed=11)
    (first,) = asyncio.run(moderate_all(gateway, [frame]))
    (again,) = asyncio.run(moderate_all(gateway, [frame]))
    assert first["escalated_from"] is not None
    assert (again["reused"], again["thinking"], again["thinking_mode"]) == ("exact", "on", "escalate")
    assert again["request_id"] == first["request_id"]


def test_a_re_ask_goes_ahead_of_fast_asks_already_waiting(start_sim: SimFactory) -> None:
    sim = start_sim("spark", time_scale=0.002)
    thinking: list[bool] = []  # each engine call in the order the engine got it: thinking on?

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            on = json.loads(request.content)["chat_template_kwargs"]["enable_thinking"]
            thinking.append(on)
            if not on:
                # A fast ask holds the slot 100 ms: the ask before it has long been parsed and its re-ask
                # queued by then (at time_scale 0.002 alone, a gateway slowed by a loaded machine could
                # finish this call first, and the next fast ask would take the slot before the re-ask
                # was even asked: the order below would then be the machine's, not the queue's).
                await asyncio.sleep(0.1)
        return await forward(request, sim.url)

    settings = Settings(auth={"admin_token": ADMIN_TOKEN}, engine={"max_inflight": 1})
    with ThreadedServer(create_app(settings, engine_transport=httpx.MockTransport(handler))) as gateway:
        set_policy(gateway, **escalating(1.0, max_share=None))
        frames = [make_keyframe("allow", 320, 180, seed=400 + i) for i in range(6)]
        results = asyncio.run(moderate_all(gateway, frames))
    assert all(d["escalated_from"] is not None for d in results)
    # One slot. A fast ask's slot goes to the next waiter as it ends, before its re-ask is queued; from
    # then on the re-ask waits ahead of every fast ask: F1 F2 R1 R2 F3 F4 R3 R4 ... (first come, first
    # served would judge all six fast before the first re-ask).
    fast = [i for i, on in enumerate(thinking) if not on]
    reasks = [i for i, on in enumerate(thinking) if on]
    assert len(fast) == len(reasks) == 6
    assert all(reasks[k] < fast[k + 2] for k in range(4)), thinking


def test_on_known_ground_truth_exactly_the_unsure_frames_escalate_and_their_disagreements_are_recovered(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    disagreement, separation, threshold = 0.3, 0.85, 0.9
    sim = start_sim(thinking_off_disagreement=disagreement, separation_auroc=separation)
    gateway = start_gateway(engine={"url": sim.url})
    set_policy(gateway, **escalating(threshold, always_categories=[], max_share=None))
    labels = ["allow", "block:violence"] * 24
    frames = [make_keyframe(label, 320, 180, seed=500 + i) for i, label in enumerate(labels)]
    results = asyncio.run(moderate_all(gateway, frames))
    recovered = standing = 0
    for label, details in zip(labels, results, strict=True):
        truth = frame_truth(
            details["frame_sha256"], Label.parse(label), disagreement=disagreement, separation=separation
        )
        fast = details["escalated_from"]
        seen_confidence = fast["confidence"] if fast else details["confidence"]
        assert seen_confidence == pytest.approx(truth.confidence_off, abs=2e-3)
        if abs(truth.confidence_off - threshold) < 2e-3:
            continue  # too close to call through the logprobs' rounding
        should = truth.thinking_off.action == "review" or truth.confidence_off < threshold
        assert (fast is not None) == should, (truth, details)
        answer = truth.thinking_on if should else truth.thinking_off
        assert details["action"] == answer.action
        assert details["thinking"] == ("on" if should else "off")
        if truth.flips_without_thinking:
            recovered += should
            standing += not should
    assert recovered > 0, "no disagreement was recovered: the test did not exercise escalation"
    assert standing > 0, "every disagreement escalated: the test did not exercise a missed one"
