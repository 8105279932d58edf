"""``POST /v1/decisions`` through the official ``openai`` client against the gateway on the simulator: typed
answers strictly valid as ``openai.types.Decision``, the engine-side distribution answered as it was set, and
bad question lists refused with a 400 naming the field."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import openai
import pytest
from openai.types import Decision

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe

FRAME = "data:image/jpeg;base64," + base64.b64encode(make_keyframe("allow", 320, 180, seed=3)).decode()
INPUT: list[Any] = [{"role": "user", "content": [{"type": "input_image", "image_url": FRAME}]}]
PREDICATE = {"type": "predicate", "name": "weapon", "instructions": "A weapon is visible."}
CHOICE = {"type": "choice", "name": "kind", "instructions": "Which kind of content is this?",
          "choices": [{"value": "violence"}, {"value": "violent", "description": "an adjective"},
                      {"value": True}]}
SCORE = {"type": "score", "name": "graphic", "instructions": "How graphic is it?",
         "levels": [{"label": "none"}, {"label": "some"}, {"label": "very", "description": "gore"}]}


def client(gateway: ThreadedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def set_answers(sim: ThreadedServer, question: str, answers: dict[str, float]) -> None:
    response = httpx.post(f"{sim.url}/sim/decisions", json={"question": question, "answers": answers})
    assert response.status_code == 200, response.text


def test_a_predicate_set_to_0_7_on_the_engine_is_answered_0_7_through_the_official_client(
    gateway: ThreadedServer, sim: ThreadedServer
) -> None:
    set_answers(sim, PREDICATE["instructions"], {"yes": 0.7, "no": 0.3})
    raw = client(gateway).decisions.with_raw_response.create(model="m", input=INPUT, questions=[PREDICATE])
    decision = Decision.model_validate(raw.http_response.json(), strict=True)
    (answer,) = decision.answers
    assert answer.type == "predicate"
    assert answer.name == "weapon"
    assert answer.probability == pytest.approx(0.7)


def test_a_predicate_a_choice_and_a_score_answer_in_order_with_distributions_over_every_option(
    gateway: ThreadedServer, sim: ThreadedServer
) -> None:
    set_answers(sim, CHOICE["instructions"], {"violence": 0.2, "violent": 0.5, "true": 0.3})
    set_answers(sim, SCORE["instructions"], {"0": 0.1, "1": 0.3, "2": 0.6})
    raw = client(gateway).decisions.with_raw_response.create(
        model="m", input=INPUT, questions=[PREDICATE, CHOICE, SCORE]
    )
    decision = Decision.model_validate(raw.http_response.json(), strict=True)
    predicate, choice, score = decision.answers
    assert predicate.type == "predicate"
    assert choice.type == "choice"
    assert score.type == "score"
    # "violence" and "violent" share their first pieces: told apart at the place after them
    assert [(p.value, round(p.probability, 6)) for p in choice.probabilities] == [
        ("violence", 0.2), ("violent", 0.5), (True, 0.3)
    ]
    assert choice.choice == "violent"
    assert choice.confidence == pytest.approx(0.5)
    assert sum(p.probability for p in choice.probabilities) == pytest.approx(1.0)
    assert [(p.label, p.value, round(p.probability, 6)) for p in score.probabilities] == [
        ("none", 0, 0.1), ("some", 1, 0.3), ("very", 2, 0.6)
    ]
    assert score.score == pytest.approx(0.3 + 1.2)
    assert score.confidence == pytest.approx(0.6)
    assert decision.usage.input_tokens > 0
    assert decision.usage.output_tokens >= 3


def test_a_string_input_is_answered(gateway: ThreadedServer, sim: ThreadedServer) -> None:
    set_answers(sim, PREDICATE["instructions"], {"yes": 0.25, "no": 0.75})
    decision = client(gateway).decisions.create(model="m", input="a knife on a table", questions=[PREDICATE])
    assert decision.answers[0].type == "predicate"
    assert decision.answers[0].probability == pytest.approx(0.25)


def refusal(gateway: ThreadedServer, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{gateway.url}/v1/decisions", json={"model": "m", "input": INPUT, **body},
                          timeout=30)
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


def test_over_400_questions_is_a_400_naming_questions(gateway: ThreadedServer) -> None:
    assert refusal(gateway, {"questions": [PREDICATE] * 401})["param"] == "questions"


def test_no_question_is_a_400_naming_questions(gateway: ThreadedServer) -> None:
    assert refusal(gateway, {"questions": []})["param"] == "questions"


def test_duplicate_choice_values_are_a_400_naming_the_choices(gateway: ThreadedServer) -> None:
    duplicated = {**CHOICE, "choices": [{"value": "a"}, {"value": "a"}]}
    error = refusal(gateway, {"questions": [PREDICATE, duplicated]})
    assert error["param"] == "questions.1.choice.choices"
    assert "twice" in error["message"]


def test_a_string_and_a_boolean_of_the_same_text_are_two_choices(
    gateway: ThreadedServer, sim: ThreadedServer
) -> None:
    typed = {**CHOICE, "instructions": "typed", "choices": [{"value": "true"}, {"value": True}]}
    set_answers(sim, "typed", {"true": 0.4, "boolean true": 0.6})
    decision = client(gateway).decisions.create(model="m", input=INPUT, questions=[typed])
    answer = decision.answers[0]
    assert answer.type == "choice"
    assert answer.choice is True
    assert [(p.value, round(p.probability, 6)) for p in answer.probabilities] == [("true", 0.4), (True, 0.6)]


def test_an_unknown_question_type_is_a_400_naming_the_question(gateway: ThreadedServer) -> None:
    error = refusal(gateway, {"questions": [{"type": "ranking", "instructions": "x"}]})
    assert error["param"] == "questions.0"


def test_an_image_that_will_not_decode_is_refused_naming_its_part(gateway: ThreadedServer) -> None:
    bad_image = {"type": "input_image", "image_url": "data:image/jpeg;base64,AAAA"}
    broken = [{"role": "user", "content": [{"type": "input_text", "text": "look"}, bad_image]}]
    response = httpx.post(f"{gateway.url}/v1/decisions",
                          json={"model": "m", "input": broken, "questions": [PREDICATE]}, timeout=30)
    # bytes that are no image: 415, as a moderated image's (a schema cannot state an image's bytes)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "input[0].content[1].image_url")


def test_a_url_that_is_not_a_data_url_is_a_400_naming_its_part(gateway: ThreadedServer) -> None:
    remote = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.jpg"}]}]
    error = refusal(gateway, {"input": remote, "questions": [PREDICATE]})
    assert error["param"] == "input[0].content[0].image_url"
