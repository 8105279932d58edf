"""``POST /v1/decisions`` (behind the business-key guard): questions about an input, answered with
probabilities read from the engine (docs/decisions-api.md).

The route orchestrates: the tenant's quota, the input shaped once (gateway/decision_prompt.py), one engine
slot for the request (the cap, the priority, the fair share charged by the work it really took), a primer
where the engine keeps a hybrid state only where a prompt ends, each question's distribution walked place by
place (gateway/engine/decision_calls.py over shaping/decisions.py), the answers in question order, one row in
the decision log.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.caller import Caller
from gateway.decision_prompt import (
    AskedQuestion,
    SharedInput,
    asked_questions,
    primer_body,
    question_body,
    shared_input,
)
from gateway.decision_wire import (
    Answer,
    ChoiceAnswer,
    ChoiceProbability,
    ChoiceQuestion,
    Decision,
    DecisionRequest,
    DecisionUsage,
    InputTokensDetails,
    OutputTokensDetails,
    PredicateAnswer,
    RefusalAnswer,
    RefusalReason,
    ScoreAnswer,
    ScoreProbability,
    ScoreQuestion,
)
from gateway.engine.decision_calls import QuestionCost, QuestionRejected, prime_input, question_distribution
from gateway.engine.pool import naming_own_model
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.routes import responses
from gateway.http.routes.moderations import refuse_deep_json, within_quota
from gateway.http.routes.responses import error_responses
from gateway.http.services import Services
from shaping.decisions import Distribution, DistributionWalk

PLACES_PER_ANSWER = 4
"""Places a question may ask per admitted answer before it gives up (answers sharing long first pieces)."""


def _answer(asked: AskedQuestion, question: Any, distribution: Distribution) -> Answer:
    """A question's typed answer from its distribution; a refusal that says why where there is none."""
    if distribution.probabilities is None:
        reason = RefusalReason(code="no_distribution", message=distribution.note or "no distribution")
        return RefusalAnswer(name=asked.name, modgate=reason)
    probabilities = distribution.probabilities
    best, confidence = distribution.best()
    if asked.kind == "predicate":
        return PredicateAnswer(name=asked.name, probability=probabilities[0])
    if isinstance(question, ChoiceQuestion):
        values = [option.value for option in question.choices]
        return ChoiceAnswer(
            choice=values[best], confidence=confidence, name=asked.name,
            probabilities=[ChoiceProbability(probability=p, value=v) for v, p in zip(values, probabilities,
                                                                                      strict=True)],
        )
    assert isinstance(question, ScoreQuestion)
    return ScoreAnswer(
        confidence=confidence, name=asked.name, score=distribution.expected_index(),
        probabilities=[
            ScoreProbability(label=level.label, probability=p, value=index)
            for index, (level, p) in enumerate(zip(question.levels, probabilities, strict=True))
        ],
    )


def _usage(cost: QuestionCost) -> DecisionUsage:
    return DecisionUsage(
        input_tokens=cost.prompt_tokens,
        input_tokens_details=InputTokensDetails(
            cache_write_tokens=cost.created_cache_tokens, cached_tokens=cost.cached_tokens
        ),
        output_tokens=cost.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=cost.reasoning_tokens),
        total_tokens=cost.prompt_tokens + cost.completion_tokens,
    )


async def decide_questions(
    services: Services, caller: Caller, data: DecisionRequest, request_id: str
) -> Decision:
    """Shape the input, hold one engine slot, walk every question's distribution, answer in order."""
    moderation = services.moderation
    settings = services.settings.engine

    async def shape(url: str) -> Any:
        return await moderation.shape(url, caller.tenant)

    shared: SharedInput = await shared_input(data, shape)
    asked = await asked_questions(data.questions, shape)
    model = await moderation.engine_identity()
    priority = 0 if settings.use_priority else None
    work = moderation.work.estimate(caller.tenant, max(1, shared.images), False)
    # N questions cost about one input and N short answers: the estimate is the input's and one answer
    # per question, corrected below by what the calls really took
    cost = QuestionCost()
    answers: list[Answer] = []
    async with moderation.engines.slot(priority=0, work=work) as held:
        client = held.engine.client
        models = moderation.identity.model_ids()
        keeper = services.prefix
        state = None if keeper is None else keeper.engines.get(held.engine.url)
        if state is not None and state.decision is not None and state.decision.primes and len(asked) > 1:
            primer = naming_own_model(primer_body(shared, model=model.id), models, held.engine.url)
            await prime_input(client, primer, request_id, cost)
        for question, one in zip(data.questions, asked, strict=True):
            body = naming_own_model(
                question_body(shared, one, model=model.id, priority=priority), models, held.engine.url
            )
            walk = DistributionWalk(one.labels, max_places=PLACES_PER_ANSWER * len(one.labels))
            try:
                distribution = await question_distribution(
                    client, body, walk, top_logprobs=max(1, settings.top_logprobs),
                    probes=settings.place_probes, request_id=request_id, cost=cost,
                )
            except QuestionRejected as exc:
                answers.append(RefusalAnswer(
                    name=one.name, modgate=RefusalReason(code="engine_rejected", message=exc.message)
                ))
                continue
            answers.append(_answer(one, question, distribution))
        held.settle(cost.prompt_tokens - cost.cached_tokens
                    + moderation.work.output_token_weight * cost.completion_tokens)
    return Decision(answers=answers, model=model.id, usage=_usage(cost))


@post(
    "/v1/decisions", status_code=200, before_request=refuse_deep_json,
    responses=error_responses(responses.MODERATION),
)
async def create_decision(
    request: Request[Any, Any, Any],
    data: JSONBody[DecisionRequest],
    services: NamedDependency[Services],
    caller: NamedDependency[Caller],
) -> Response[Decision]:
    """Answer predicate, choice and score questions about an input with the engine's probabilities."""
    request_id = f"decr-{uuid.uuid4().hex}"
    started = time.monotonic()
    del started
    return await within_quota(  # an image counts against the keyframe quota; a text-only input as one
        services, caller, 1,
        lambda: cancel_on_disconnect(request, decide_questions(services, caller, data, request_id)),
    )


ROUTES = [create_decision]
