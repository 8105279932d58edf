"""The gateway end to end against the real vLLM: the official client gets a well-formed verdict."""

from __future__ import annotations

import openai
import pytest

from deploy.keyframes import make_keyframe
from tests.support import GatewayFactory, image_input

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("thinking", ["on", "off"])
def test_a_keyframe_through_the_gateway_to_real_vllm_gets_a_well_formed_result(
    real_engine_url: str, start_gateway: GatewayFactory, thinking: str
) -> None:
    gateway = start_gateway(engine={"url": real_engine_url})
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        response = client.moderations.create(
            model="modgate-moderation",
            input=image_input(make_keyframe("block:violence", 640, 360, seed=9)),
            extra_headers={"X-Modgate-Thinking": thinking},
        )
    (result,) = response.results
    details = result.model_extra["modgate"]
    # Random weights: any action is a correct answer, as long as it is one of the three and says why when
    # the output could not be used (then it is a review; a review the model chose has no reason).
    assert details["action"] in ("allow", "review", "block")
    if details["reason"]:
        assert details["action"] == "review"
    assert details["thinking"] == thinking
    assert details["prompt_tokens"] > details["image_tokens"] > 0
    assert details["ttft_ms"] is not None
    assert (details["reasoning_tokens"] > 0) == (thinking == "on")
    assert isinstance(result.flagged, bool)
    assert details["verdict_format"] == "compact"
    if details["reason"] is None:  # a verdict the engine finished: its confidence is read from its logprobs
        assert 0 < details["confidence"] <= 1
        assert details["completion_tokens"] - details["reasoning_tokens"] <= 12
    else:
        assert details["confidence"] is None
        assert details["confidence_reason"]


def test_a_text_only_input_is_accepted_and_judged_by_real_vllm(
    real_engine_url: str, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": real_engine_url})
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        response = client.moderations.create(
            input=["a calm street at noon", "another line"], extra_headers={"X-Modgate-Thinking": "off"}
        )
    assert len(response.results) == 2  # one per string
    for result in response.results:
        details = result.model_extra["modgate"]
        assert result.category_applied_input_types.violence == ["text"]
        assert details["completion_tokens"] > 0
        # The engine is held to one verdict: random weights may say anything, but never an answer that
        # cannot be a verdict at all (the old {"frames": []} constraint made every text a "review").
        assert details["action"] in ("allow", "review", "block")
        assert "is not one of allow/review/block" not in (details["reason"] or "")
