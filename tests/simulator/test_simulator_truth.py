"""The simulator's per-frame ground truth: difficulty drives both the thinking-off flips and confidence."""

from __future__ import annotations

import base64
import json
import math

import httpx
import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from deploy.keyframes import Label, make_keyframe
from deploy.simulator import frame_truth
from shaping.confidence import TokenLogprob, with_confidence
from shaping.verdict import compact_regex, parse_engine_output
from tests.support import SimFactory

FRAMES = 20_000


def auroc(low_confidence_flipped: np.ndarray, low_confidence_kept: np.ndarray) -> float:
    """P(a flipped frame's confidence is below a kept frame's), ties half (Mann-Whitney U / n1 n2)."""
    u = mannwhitneyu(-low_confidence_flipped, -low_confidence_kept).statistic
    return float(u) / (len(low_confidence_flipped) * len(low_confidence_kept))


@pytest.mark.parametrize("separation", [0.75, 0.85, 0.95])
def test_confidence_separates_the_frames_thinking_would_change_at_the_preset_auroc(separation: float) -> None:
    truths = [
        frame_truth(f"frame-{i}", Label("allow"), disagreement=0.06, separation=separation)
        for i in range(FRAMES)
    ]
    flipped = np.array([t.confidence_off for t in truths if t.flips_without_thinking])
    kept = np.array([t.confidence_off for t in truths if not t.flips_without_thinking])
    share = len(flipped) / FRAMES
    assert 0.055 <= share <= 0.065, share  # 6 % ± 3 standard errors of 20,000 frames
    measured = auroc(flipped, kept)
    print(f"separation {separation}: flipped {share:.3%}, AUROC {measured:.3f}")
    assert abs(measured - separation) < 0.02, measured
    assert all(t.thinking_off.action == "block" for t in truths if t.flips_without_thinking)
    assert all(t.thinking_off == t.thinking_on for t in truths if not t.flips_without_thinking)


def test_a_frames_truth_is_the_same_every_time_and_differs_between_frames() -> None:
    first = frame_truth("abc", Label("block", "hate"), disagreement=0.06, separation=0.85)
    assert first == frame_truth("abc", Label("block", "hate"), disagreement=0.06, separation=0.85)
    difficulties = {
        frame_truth(f"f{i}", Label("allow"), disagreement=0.06, separation=0.85).difficulty for i in range(50)
    }
    assert len(difficulties) == 50
    assert first.thinking_on.categories == ("hate",)
    assert 1 / 3 < first.confidence_off < 1
    assert 1 / 3 < first.confidence_on < 1


def data_url(image: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(image).decode()


def chat(image: bytes, thinking: bool, stream: bool = False, identity: str = "frame-7") -> dict[str, object]:
    return {
        "messages": [
            {"role": "system", "content": "You moderate."},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(image)}, "uuid": identity},
                    {"type": "text", "text": "check"},
                ],
            },
        ],
        "chat_template_kwargs": {"enable_thinking": thinking},
        "structured_outputs": {"regex": compact_regex()},
        "logprobs": True,
        "top_logprobs": 5,
        "stream": stream,
    }


def test_the_simulator_answers_what_its_truth_says_with_that_confidence_in_its_logprobs(
    start_sim: SimFactory,
) -> None:
    sim = start_sim(thinking_off_disagreement=0.5)  # so both outcomes are likely among a few frames
    seen_flip = seen_kept = False
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        for seed in range(12):
            image = make_keyframe("block:hate", 160, 90, seed=seed)
            truth = client.post("/sim/truth", json={"url": data_url(image), "uuid": f"frame-{seed}"}).json()
            assert truth["label"] == "block:hate"
            for thinking in (False, True):
                body = chat(image, thinking, identity=f"frame-{seed}")
                choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
                content = choice["message"]["content"]
                expected = truth["thinking_on" if thinking else "thinking_off"]
                wanted = (
                    "block:" + ",".join(expected["categories"]) if expected["action"] == "block" else None
                )
                assert content == (wanted or expected["action"])
                entries = [TokenLogprob.from_wire(e) for e in choice["logprobs"]["content"]]
                (verdict,) = with_confidence(
                    parse_engine_output(content, None, "stop").verdicts, entries, content
                )
                key = "confidence_on" if thinking else "confidence_off"
                assert verdict.confidence == pytest.approx(truth[key], abs=1e-3)
                if not thinking:
                    seen_flip |= truth["flips_without_thinking"]
                    seen_kept |= not truth["flips_without_thinking"]
    assert seen_flip
    assert seen_kept


def test_logprobs_come_in_vllms_shape_streamed_and_not(start_sim: SimFactory) -> None:
    sim = start_sim()
    image = make_keyframe("allow", 160, 90, seed=3)
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        whole = client.post("/v1/chat/completions", json=chat(image, True)).json()
        streamed = client.post("/v1/chat/completions", json=chat(image, True, stream=True)).text
    entries = whole["choices"][0]["logprobs"]["content"]
    for entry in entries:
        assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 5  # as vLLM: exactly top_logprobs alternatives
        assert all(set(alt) == {"token", "logprob", "bytes"} for alt in entry["top_logprobs"])
    assert len(entries) == whole["usage"]["completion_tokens"]  # every generated token, the stop token too
    chunks = [json.loads(line[5:]) for line in streamed.splitlines() if line.startswith("data: {")]
    streamed_entries = [
        entry
        for chunk in chunks
        for choice in chunk["choices"]
        if choice["logprobs"]
        for entry in choice["logprobs"]["content"]
    ]
    # one entry per token, streamed or not; as on vLLM the closing </think> comes in a chunk of its own
    assert [e["token"] for e in streamed_entries] == [e["token"] for e in entries]
    assert {"delta": {}, "finish_reason": None}.items() <= next(
        c["choices"][0]
        for c in chunks
        if c["choices"]
        and c["choices"][0]["logprobs"]
        and c["choices"][0]["logprobs"]["content"][0]["token"] == "</think>"
    ).items()
    assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] == len(entries) - 3
    assert whole["choices"][0]["message"]["content"] == "allow"


def test_the_compact_verdict_costs_the_stop_token_more_than_its_pieces(start_sim: SimFactory) -> None:
    sim = start_sim(thinking_off_disagreement=0.0)
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        usage = {
            label: client.post(
                "/v1/chat/completions", json=chat(make_keyframe(label, 160, 90, seed=1), False)
            ).json()["usage"]["completion_tokens"]
            for label in ("allow", "review", "block:violence", "block:harassment", "block:self-harm")
        }
    # Qwen's BPE: block : viol ence, block : har ass ment, block :self -h arm (the colon merges with "self")
    assert usage == {
        "allow": 2,
        "review": 2,
        "block:violence": 5,
        "block:harassment": 6,
        "block:self-harm": 5,
    }


def test_the_fast_verdicts_alternatives_say_nothing_of_thinking_ons_answer(start_sim: SimFactory) -> None:
    # a thinking-off block:violence is either right (the label is block:violence) or a flip (thinking on
    # says allow): its runner-up alternatives must not tell the two apart, or they leak ground truth
    sim = start_sim(thinking_off_disagreement=0.5)
    doubts: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        for label in ("allow", "block:violence"):
            for seed in range(10):
                image = make_keyframe(label, 160, 90, seed=seed)
                identity = f"{label}-{seed}"
                truth = client.post("/sim/truth", json={"url": data_url(image), "uuid": identity}).json()
                body = chat(image, False, identity=identity)
                choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
                if choice["message"]["content"] != "block:violence":
                    continue
                first = choice["logprobs"]["content"][0]
                listed = {alt["token"]: math.exp(alt["logprob"]) for alt in first["top_logprobs"]}
                rest = 1 - listed["block"]
                doubt = {t: round(p / rest, 6) for t, p in listed.items() if t in ("allow", "review")}
                doubts[truth["flips_without_thinking"]].append(doubt)
    assert doubts[True], doubts  # both kinds of frame were seen
    assert doubts[False], doubts
    # where the doubt goes is the same for every block, whatever thinking on would say
    assert {json.dumps(d, sort_keys=True) for d in doubts[True] + doubts[False]} == {
        json.dumps({"allow": 0.25, "review": 0.75}, sort_keys=True)
    }
