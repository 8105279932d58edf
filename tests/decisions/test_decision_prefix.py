"""A Decisions request's input is computed once: every question's prompt starts with the shaped input, and on
a hybrid engine (a linear-attention state kept only where a prompt ends) a primer ends a prompt there first,
at the input's end or at the part a ``prompt_cache_breakpoint`` marks."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx

from deploy.keyframes import make_keyframe
from gateway.decision_prompt import shared_input
from gateway.decision_wire import DecisionRequest
from shaping.image import ShapedImage
from tests.support import GatewayFactory, SimFactory

FRAME = "data:image/jpeg;base64," + base64.b64encode(make_keyframe("allow", 640, 360, seed=7)).decode()
QUESTIONS = [{"type": "predicate", "instructions": f"Statement {i} holds."} for i in range(4)]


def usage(gateway_url: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "m", "input": [{"role": "user", "content": content}], "questions": QUESTIONS}
    response = httpx.post(f"{gateway_url}/v1/decisions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    answered: dict[str, Any] = response.json()["usage"]
    return answered


def test_on_a_hybrid_engine_the_primer_lets_every_question_take_the_input_from_the_cache(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    primed = start_gateway(engine={"url": start_sim("hybrid-cpu", prefix_match_unit=16).url})
    unprimed = start_gateway(engine={"url": start_sim("hybrid-cpu", prefix_match_unit=16).url},
                             shaping={"prefix_strategy": "off"})
    image = [{"type": "input_image", "image_url": FRAME}]
    with_primer, without = usage(primed.url, image), usage(unprimed.url, image)
    assert without["input_tokens_details"]["cached_tokens"] == 0
    # the four questions each take the input's whole 16-token units from the state the primer left
    cached = with_primer["input_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached % (4 * 16) == 0
    computed = with_primer["input_tokens"] - with_primer["input_tokens_details"]["cached_tokens"]
    assert computed < without["input_tokens"] / 2


def test_a_breakpoint_ends_the_primed_prefix_at_its_part(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    def fresh() -> str:  # an engine of its own: nothing the other request left in its cache
        return start_gateway(engine={"url": start_sim("hybrid-cpu", prefix_match_unit=16).url}).url

    text = "Frames from the uploader's channel, judged by the channel's own policy. " * 8
    image = {"type": "input_image", "image_url": FRAME}
    whole = usage(fresh(), [{"type": "input_text", "text": text}, image])
    marked = usage(fresh(), [
        {"type": "input_text", "text": text, "prompt_cache_breakpoint": {"mode": "explicit"}}, image
    ])
    # the state is kept after the text, not after the image: the questions compute the image again
    cached = marked["input_tokens_details"]["cached_tokens"]
    assert 0 < cached < whole["input_tokens_details"]["cached_tokens"]


def test_the_breakpoint_cuts_the_shared_input_after_its_part() -> None:
    async def shape(url: str) -> ShapedImage:
        raise AssertionError("no image here")

    request = DecisionRequest.model_validate({
        "model": "m", "questions": QUESTIONS,
        "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "a", "prompt_cache_breakpoint": {"mode": "explicit"}},
            {"type": "input_text", "text": "b"},
        ]}],
    })
    shared = asyncio.run(shared_input(request, shape))
    assert shared.up_to_breakpoint is not None
    assert shared.up_to_breakpoint[-1]["content"] == [{"type": "text", "text": "a"}]
    assert shared.messages[-1]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
