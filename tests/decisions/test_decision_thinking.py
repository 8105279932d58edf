"""Thinking for Decisions follows the tenant's thinking policy: off unless a rule tagged ``decisions`` says
``on``; then the model thinks first and the distribution is read at the answer after its thought (answers that
share first tokens told apart after the thought too), and the log says so."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory

FRAME = "data:image/jpeg;base64," + base64.b64encode(make_keyframe("allow", 320, 180, seed=8)).decode()
CHOICE = {"type": "choice", "instructions": "Which kind?",
          "choices": [{"value": "violence"}, {"value": "violent"}, {"value": "calm"}]}


def set_policy(gateway: ThreadedServer, rules: list[dict[str, Any]]) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": "tester"}
    current = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=headers).json()
    changed = {key: current[key] for key in ("default_mode", "max_completion_tokens_on",
                                             "max_completion_tokens_off")}
    response = httpx.put(f"{gateway.url}/admin/thinking-policy", headers=headers,
                         json={**changed, "rules": rules, "reason": "decisions think"})
    assert response.status_code == 200, response.text


def decide(gateway: ThreadedServer) -> dict[str, Any]:
    body = {"model": "m", "questions": [CHOICE],
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": FRAME}]}]}
    response = httpx.post(f"{gateway.url}/v1/decisions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    answered: dict[str, Any] = response.json()
    return answered


def test_by_default_decisions_do_not_think(gateway: ThreadedServer, sim: ThreadedServer) -> None:
    assert decide(gateway)["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


def test_a_rule_tagged_decisions_makes_the_model_think_and_the_answer_after_the_thought_is_read(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine={"url": sim.url})
    set_policy(gateway, [{"name": "decisions-think", "tags": ["decisions"], "mode": "on"}])
    httpx.post(f"{sim.url}/sim/decisions", json={
        "question": "Which kind?", "answers": {"violence": 0.2, "violent": 0.5, "calm": 0.3}})
    answered = decide(gateway)
    assert answered["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    (answer,) = answered["answers"]
    assert [p["probability"] for p in answer["probabilities"]] == pytest.approx([0.2, 0.5, 0.3])
    assert answer["choice"] == "violent"
