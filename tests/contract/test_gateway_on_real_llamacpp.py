"""The gateway in front of the real llama.cpp server: the README's first request and a keyframe batch through
the official ``openai`` client, the kind and slots detected, and what llama.cpp refuses said clearly."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import openai
import pytest

from deploy.keyframes import make_keyframe
from shaping.confidence import NOTHING_ADMITTED
from tests.shaping_gateway.test_verdict_reuse import flip
from tests.support import GatewayFactory, data_url, image_input

pytestmark = pytest.mark.llamacpp


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("thinking", ["on", "off"])
def test_the_readmes_first_request_through_the_gateway_to_llamacpp_gets_a_verdict(
    real_llamacpp_url: str, start_gateway: GatewayFactory, thinking: str
) -> None:
    gateway = start_gateway(engine={"url": real_llamacpp_url})
    with client_for(gateway.url) as client:
        response = client.moderations.create(
            model="modgate-moderation",
            input=image_input(make_keyframe("block:violence", 640, 360, seed=9)),
            extra_headers={"X-Modgate-Thinking": thinking},
        )
    (result,) = response.results
    details = result.model_extra["modgate"]
    assert details["action"] in ("allow", "review", "block")
    if details["reason"]:
        assert details["action"] == "review"
    assert details["thinking"] == thinking
    assert details["prompt_tokens"] > 0
    # llama.cpp's usage carries no image token count (docs/engines.md): unknown, with why; not 0, not a guess
    assert details["image_tokens"] is None
    assert "reports no image tokens" in details["image_tokens_reason"]
    assert details["ttft_ms"] is not None
    assert isinstance(result.flagged, bool)
    if details["reason"] is not None:
        assert details["confidence_reason"]
    elif details["confidence"] is None:
        # llama.cpp's logprobs are a float softmax over the raw logits: the tiny model puts all of it on one
        # blank token, so every spelling the grammar allows reads 0 and nothing can be renormalised
        # (pinned on the engine by test_llamacpp_logprobs_are_a_raw_softmax_the_grammar_does_not_mask);
        # thinking off, a probe reads the grammar's distribution instead (the test below): thinking on only
        assert thinking == "on"
        assert details["confidence_reason"].partition(":")[0] == NOTHING_ADMITTED
    else:  # a finished verdict: its confidence exact over what the grammar admits (a probe read it)
        assert thinking == "off"
        assert details["confidence_reason"] is None
        assert 0 < details["confidence"] <= 1


def thinking_off_batch(gateway: str, clip: str, seed: int, *, packing: int) -> Any:
    """Three keyframes (allow, block:violence, allow) from ``seed`` on, asked with thinking off."""
    frames = [
        {"image_url": {"url": data_url(make_keyframe(label, 640, 360, seed=at))}, "timestamp_ms": 500 * n}
        for n, label in enumerate(("allow", "block:violence", "allow"))
        for at in [seed + n]
    ]
    with client_for(gateway) as client:
        return client.post(
            f"/videos/{clip}/keyframes",
            body={"frames": frames, "packing": packing, "thinking": "off"},
            cast_to=object,
        )


def test_a_keyframe_batch_through_the_gateway_to_llamacpp_gets_a_verdict_per_frame(
    real_llamacpp_url: str, start_gateway: GatewayFactory
) -> None:
    answer = thinking_off_batch(start_gateway(engine={"url": real_llamacpp_url}).url, "clip-1", 3, packing=1)
    assert answer["object"] == "video.keyframes.moderation"
    assert [frame["index"] for frame in answer["frames"]] == [0, 1, 2]
    for frame in answer["frames"]:
        assert frame["modgate"]["action"] in ("allow", "review", "block")
    assert answer["verdict"]["action"] in ("allow", "review", "block")


@pytest.mark.parametrize("packing", [1, 3])
def test_thinking_off_verdicts_through_llamacpp_come_back_with_the_grammars_confidence(
    real_llamacpp_url: str, start_gateway: GatewayFactory, packing: int
) -> None:
    """The tiny model's raw softmax gives every allowed spelling 0 in float; the grammar's distribution at
    each verdict's first token (a probe read after llama.cpp's sampler chain) still has mass on the allowed
    actions, so every verdict, the packed ones after the first line too, comes back with a confidence."""
    gateway = start_gateway(engine={"url": real_llamacpp_url})
    answer = thinking_off_batch(gateway.url, "clip-2", 13, packing=packing)
    read = [(f["modgate"]["action"], f["modgate"]["confidence"], f["modgate"]["confidence_reason"])
            for f in answer["frames"]]
    print(f"\nllama.cpp verdicts, packing {packing} (action, confidence, reason):", read)
    for action, confidence, reason in read:
        assert action in ("allow", "review", "block")
        assert confidence is not None, reason
        assert reason is None
        # the greedy token is the grammar's distribution's best (test_llamacpp_reads_the_grammars_...), so
        # the exact share of the action it begins is at least the best of the admitted tokens' shares
        assert 1 / 3 < confidence <= 1


def test_the_gateway_caps_llamacpp_at_its_slots_and_names_its_kind(
    real_llamacpp_url: str, start_gateway: GatewayFactory
) -> None:
    slots = httpx.get(f"{real_llamacpp_url}/props", timeout=30).json()["total_slots"]
    gateway = start_gateway(engine={"url": real_llamacpp_url, "max_inflight": 32})
    ready = httpx.get(f"{gateway.url}/readyz", timeout=30).json()
    (engine,) = ready["engines"]
    assert engine["cap"] == slots < 32
    assert engine["kind"] == "llamacpp"
    assert ready["model"]["root"].startswith("llamacpp:")  # verdict reuse is scoped by the engine's kind


def test_an_image_sent_to_a_llamacpp_without_a_vision_projector_gets_a_clear_error(
    start_gateway: GatewayFactory, real_llamacpp_url: str
) -> None:
    from deploy.engine_llamacpp import boot_llamacpp

    engine, _timings = boot_llamacpp(slots=1, vision=False)
    with engine:
        gateway = start_gateway(engine={"url": engine.url})
        with client_for(gateway.url) as client, pytest.raises(openai.APIStatusError) as caught:
            client.moderations.create(input=image_input(make_keyframe("allow", 320, 180, seed=2)))
    error = caught.value
    assert 400 <= error.status_code < 600
    assert error.status_code != 500
    body = error.response.json()["error"]
    assert {"message", "type", "code"} <= set(body)
    assert "--mmproj" in body["message"]


def test_a_thinking_on_request_closed_by_its_reasoning_budget_gets_a_finished_verdict_from_llamacpp(
    real_llamacpp_url: str, start_gateway: GatewayFactory
) -> None:
    """llama.cpp writes ``</think>`` at the budget and the grammar's thought rule lets at most two line
    breaks follow: the verdict comes next, not line breaks until max_completion_tokens (the tiny model's
    best token is one)."""
    gateway = start_gateway(engine={"url": real_llamacpp_url})
    flip(gateway, default_mode="on", thinking_token_budget=16)
    with client_for(gateway.url) as client:
        response = client.moderations.create(
            model="modgate-moderation",
            input=image_input(make_keyframe("block:violence", 640, 360, seed=9)),
            extra_headers={"X-Modgate-Thinking": "on"},
        )
    details = response.results[0].model_extra["modgate"]
    assert details["reason"] is None, details
    assert details["action"] in ("allow", "review", "block")  # the model's own verdict, parsed
    assert details["completion_tokens"] <= 16 + 12  # the thought, </think>, two line breaks, the verdict


def test_token_prediction_on_llamacpp_counts_text_through_its_own_endpoints(
    real_llamacpp_url: str, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # llama-server's /apply-template and /tokenize predict a text-only request's prompt tokens to the token;
    # a request with images is not predicted (its /tokenize takes text), said once at start.
    with caplog.at_level(logging.WARNING, logger="modgate.moderation"):
        gateway = start_gateway(engine={"url": real_llamacpp_url})
        for body in ({"input": "a text only request"},
                     {"input": image_input(make_keyframe("allow", 640, 360, seed=11))}):
            response = httpx.post(f"{gateway.url}/v1/moderations", json=body, timeout=300,
                                  headers={"X-Modgate-Thinking": "off"})
            assert response.status_code == 200, response.text
    said = [r.getMessage() for r in caplog.records if "token prediction" in r.getMessage()]
    assert len(said) == 1, said
    assert "off for requests with images" in said[0]
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert "modgate_token_predictions_total 1.0" in metrics
    assert "modgate_token_prediction_mismatches_total 0.0" in metrics


def test_a_text_verdict_through_the_hybrid_on_llamacpp_comes_back_with_the_grammars_confidence(
    real_hybrid_llamacpp_url: str, start_gateway: GatewayFactory
) -> None:
    """The tiny hybrid (a recurrent model, text only) through llama-server: thinking off, its verdict's
    confidence is read from the grammar's distribution at the verdict's first token, never null."""
    gateway = start_gateway(engine={"url": real_hybrid_llamacpp_url})
    with client_for(gateway.url) as client:
        response = client.moderations.create(
            model="modgate-moderation", input="a quiet street at night",
            extra_headers={"X-Modgate-Thinking": "off"},
        )
    details = response.results[0].model_extra["modgate"]
    print("\nhybrid on llama.cpp:", details["action"], details["confidence"], details["confidence_reason"])
    assert details["confidence"] is not None, details["confidence_reason"]
    assert 0 < details["confidence"] <= 1
