"""Where the engine gives no distribution, the question is a refusal that says why, never a made-up 1.0;
where it refuses one question's request, that question is a refusal and the others are answered."""

from __future__ import annotations

from typing import Any

from litestar.testing import AsyncTestClient

from gateway.http.app import create_app
from gateway.settings import EngineSettings, Settings
from tests.engine_check.test_startup_check import altered_engine
from tests.support import SimFactory

PREDICATE = {"type": "predicate", "name": "p", "instructions": "Statement one."}
REJECTED = {"type": "predicate", "name": "r", "instructions": "Statement two."}


def without_logprobs(path: str, sent: dict[str, Any], answer: Any) -> tuple[int, Any] | None:
    for choice in answer.get("choices", []) if isinstance(answer, dict) else ():
        choice["logprobs"] = None
    return None


def rejecting_the_second(path: str, sent: dict[str, Any], answer: Any) -> tuple[int, Any] | None:
    last = (sent.get("messages") or [{}])[-1].get("content", [])
    if isinstance(last, list) and last and last[0].get("text") == REJECTED["instructions"]:
        return 400, {"error": {"message": "prompt is too long", "type": "BadRequestError", "code": 400}}
    return None


async def answers(start_sim: SimFactory, alter: Any, questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sim = start_sim()
    app = create_app(Settings(engine=EngineSettings(url="http://engine.test")),
                     engine_transport=altered_engine(sim.url, alter))
    async with AsyncTestClient(app) as http:
        response = await http.post("/v1/decisions", json={"model": "m", "input": "x", "questions": questions})
    assert response.status_code == 200, response.text
    answered: list[dict[str, Any]] = response.json()["answers"]
    return answered


async def test_no_logprobs_from_the_engine_is_a_refusal_that_says_so(start_sim: SimFactory) -> None:
    (answer,) = await answers(start_sim, without_logprobs, [PREDICATE])
    assert answer["type"] == "refusal"
    assert answer["name"] == "p"
    assert answer["modgate"]["code"] == "no_distribution"
    assert "log-probabilities" in answer["modgate"]["message"]


async def test_a_question_the_engine_refuses_is_a_refusal_and_the_others_are_answered(
    start_sim: SimFactory,
) -> None:
    first, second = await answers(start_sim, rejecting_the_second, [PREDICATE, REJECTED])
    assert first["type"] == "predicate"
    assert second["type"] == "refusal"
    assert second["modgate"]["code"] == "engine_rejected"
