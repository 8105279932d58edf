"""``client.decisions.create`` through the gateway to the real vLLM CPU engine: a predicate, a choice and a
score about one keyframe come back as three typed answers, strictly valid as ``openai.types.Decision``, each
distribution over every option and summing to 1, read from the engine's grammar-masked log-probabilities."""

from __future__ import annotations

import base64
from typing import Any

import openai
import pytest
from openai.types import Decision

from deploy.keyframes import make_keyframe
from tests.support import GatewayFactory

pytestmark = pytest.mark.vllm


def test_three_questions_about_a_keyframe_get_three_typed_answers_from_real_vllm(
    real_engine_url: str, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": real_engine_url})
    frame = base64.b64encode(make_keyframe("block:violence", 640, 360, seed=9)).decode()
    questions: list[Any] = [
        {"type": "predicate", "name": "weapon", "instructions": "A weapon is visible."},
        {"type": "choice", "name": "animal", "instructions": "Which animal is shown?",
         "choices": [{"value": "cat"}, {"value": "dog"}, {"value": False}]},
        {"type": "score", "name": "graphic", "instructions": "How graphic is the frame?",
         "levels": [{"label": "none"}, {"label": "some"}, {"label": "very"}]},
    ]
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=600) as client:
        raw = client.decisions.with_raw_response.create(
            model="tiny",
            input=[{"role": "user", "content": [
                {"type": "input_image", "image_url": f"data:image/jpeg;base64,{frame}"}
            ]}],
            questions=questions,
        )
    decision = Decision.model_validate(raw.http_response.json(), strict=True)
    predicate, choice, score = decision.answers
    assert predicate.type == "predicate"
    assert 0 <= predicate.probability <= 1
    assert choice.type == "choice"
    assert [p.value for p in choice.probabilities] == ["cat", "dog", False]
    assert sum(p.probability for p in choice.probabilities) == pytest.approx(1.0)
    assert score.type == "score"
    assert [p.value for p in score.probabilities] == [0, 1, 2]
    assert sum(p.probability for p in score.probabilities) == pytest.approx(1.0)
    assert decision.usage.input_tokens > 0
