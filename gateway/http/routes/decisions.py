"""``POST /v1/decisions`` (behind the business-key guard): questions about an input, answered with
probabilities read from the engine (docs/decisions-api.md).

The route orchestrates: the tenant's quota, the input shaped once (gateway/decision_prompt.py), the first
question in one engine slot (with a primer where the engine keeps a hybrid state only where a prompt ends)
and the others on a few slots at once (each slot within the cap, queued by priority and the fair share and
charged the work it really took), each question's distribution walked place by place
(gateway/engine/decision_calls.py over shaping/decisions.py), the answers in question order, one row in the
decision log.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.caller import Caller
from gateway.decision_prompt import (
    AskedQuestion,
    SharedInput,
    Thinking,
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
    InputImage,
    InputTokensDetails,
    OutputTokensDetails,
    PredicateAnswer,
    RefusalAnswer,
    RefusalReason,
    ScoreAnswer,
    ScoreProbability,
    ScoreQuestion,
)
from gateway.decisions.questions import QuestionLog, QuestionRow
from gateway.engine.decision_calls import (
    DECISION_TOP_LOGPROBS,
    QuestionCost,
    QuestionRejected,
    prime_input,
    question_distribution,
)
from gateway.engine.fairness import Work
from gateway.engine.held_engine import HeldEngine, naming_own_model
from gateway.engine.prefix_keeper import PrefixKeeper
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.quotas import TenantQuotas
from gateway.http.routes import responses
from gateway.http.routes.moderations import refuse_deep_json, within_quota
from gateway.http.routes.responses import error_responses
from gateway.moderation.service import ModerationService
from gateway.policy.rules import RequestContext, decide
from gateway.settings import EngineSettings, Settings
from gateway.telemetry.recorder import FinishedRequest
from shaping.decisions import Distribution, DistributionWalk
from shaping.image import ShapedImage

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


def image_count(data: DecisionRequest) -> int:
    """The request's images: its input's and its questions' instructions'."""
    parts: list[object] = []
    if not isinstance(data.input, str):
        parts += [part for message in data.input if not isinstance(message.content, str)
                  for part in message.content]
    parts += [part for question in data.questions if not isinstance(question.instructions, str)
              for part in question.instructions]
    return sum(isinstance(part, InputImage) for part in parts)


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


DECISIONS_TAG = "decisions"
"""The tag a Decisions request carries to the thinking policy (a rule with ``tags: [decisions]``)."""
QUESTION_SLOTS = 4
"""Engine slots a request's questions run on at once, after its first (each slot takes the next question;
the engine batches them, as it would separate requests)."""
QUESTION_TOKENS = 64
"""A question's own prompt tokens and answer, about, in the fair share's first estimate (the real usage
settles it)."""


async def decide_questions(
    moderation: ModerationService, prefix: PrefixKeeper, question_log: QuestionLog, settings: EngineSettings,
    caller: Caller, data: DecisionRequest, request_id: str,
) -> Decision:
    """Shape the input, hold one engine slot, walk every question's distribution, answer in order, log it."""
    started = time.monotonic()
    policy = moderation.policies.current()
    # The tenant's thinking policy, asked with the tag ``decisions``: a rule that matches it and says ``on``
    # lets the model think first; otherwise (the policy's default, escalate, the load rule) it answers
    # thinking off, as a distribution read at the answer's first token needs no thought.
    thinking = decide(policy, RequestContext(tenant=caller.tenant, tags=(DECISIONS_TAG,)),
                      under_load=moderation.load.update(policy.load))
    think = Thinking(
        on=thinking.mode == "on" and thinking.rule.startswith("rule:"),
        # the policy's cap is per keyframe's thought and verdict: here one thought and one short answer
        max_completion_tokens=thinking.max_completion_tokens,
        thinking_token_budget=thinking.thinking_token_budget,
    )
    frames: dict[str, str] = {}  # each image's URL: its shaped frame's hash (for the log)

    async def shape(url: str) -> ShapedImage:
        shaped = await moderation.shape(url, caller.tenant, identity=False)  # nothing reuses its verdict
        frames[url] = shaped.sha256
        return shaped

    shared: SharedInput = await shared_input(data, shape)
    asked = await asked_questions(data.questions, shape)
    model = await moderation.engine_identity()
    priority = 0 if settings.use_priority else None
    # the fair share's first estimate: the input once, then each question's own tokens (and its thought,
    # with thinking on: the estimate's thought over a thinking-off one), settled by what the calls took
    base = moderation.work.estimate(caller.tenant, max(1, len(frames)), False).cost
    thought = moderation.work.estimate(caller.tenant, 1, True).cost - moderation.work.estimate(
        caller.tenant, 1, False).cost if think.on else 0.0
    per_question = QUESTION_TOKENS + thought
    models = moderation.identity.model_ids()
    answers: list[Answer | None] = [None] * len(asked)
    cost = QuestionCost()

    async def ask(index: int, held: HeldEngine, spent: QuestionCost) -> None:
        one, question = asked[index], data.questions[index]
        body = naming_own_model(
            question_body(shared, one, model=model.id, priority=priority, thinking=think), models,
            held.engine.url,
        )
        walk = DistributionWalk(one.labels, max_places=PLACES_PER_ANSWER * len(one.labels))
        try:
            distribution = await question_distribution(
                held.engine.client, body, walk, top_logprobs=DECISION_TOP_LOGPROBS,
                probes=settings.place_probes, request_id=request_id, cost=spent, thinking=think.on,
            )
        except QuestionRejected as exc:
            reason = RefusalReason(code="engine_rejected", message=exc.message)
            answers[index] = RefusalAnswer(name=one.name, modgate=reason)
            return
        answers[index] = _answer(one, question, distribution)

    async def on_a_slot(indices: Iterator[int], expected: float, first: bool = False) -> None:
        """Questions taken from ``indices`` one after another in one engine slot, charged what they took."""
        spent = QuestionCost()
        async with moderation.engines.slot(priority=0, work=Work(caller.tenant, expected, think.on)) as held:
            state = prefix.engines.get(held.engine.url)
            if first and len(asked) > 1 and state is not None and state.decision is not None \
                    and state.decision.primes:
                primer = naming_own_model(primer_body(shared, model=model.id), models, held.engine.url)
                await prime_input(held.engine.client, primer, request_id, spent)
            for index in indices:
                await ask(index, held, spent)
            held.settle(spent.prompt_tokens - spent.cached_tokens
                        + moderation.work.output_token_weight * spent.completion_tokens)
        cost.merge(spent)

    # The first question alone: the engine computes the input once (and keeps it, primed where it must be);
    # then the others share it, on up to QUESTION_SLOTS slots at once, each slot taking the next question.
    await on_a_slot(iter([0]), base + per_question, first=True)
    rest = iter(range(1, len(asked)))
    slots = min(QUESTION_SLOTS, len(asked) - 1)
    async with asyncio.TaskGroup() as group:
        for _ in range(slots):
            group.create_task(on_a_slot(rest, per_question * -(-(len(asked) - 1) // slots)))
    answered = [answer for answer in answers if answer is not None]
    assert len(answered) == len(asked)  # every slot ran to its end, or the group raised
    moderation.judge.calls.tokens(cost.prompt_tokens, cost.cached_tokens)  # the engine calls' own figures
    decision = Decision(answers=answered, model=model.id, usage=_usage(cost))
    await question_log.append(QuestionRow(
        decided_at=datetime.now(UTC), request_id=request_id, tenant=caller.tenant,
        frame_sha256=list(dict.fromkeys(frames.values())),
        questions=[_logged(question.model_dump(mode="json"), frames) for question in data.questions],
        answers=[answer.model_dump(mode="json") for answer in answered],
        model=model.id, model_revision=model.revision or None, policy_version=thinking.policy_version,
        thinking="on" if think.on else "off", thinking_rule=thinking.rule,
        latency_ms=(time.monotonic() - started) * 1000,
    ))
    return decision


def _logged(value: Any, frames: dict[str, str]) -> Any:
    """``value`` with every image URL replaced by its frame's hash: the log never keeps a frame."""
    if isinstance(value, dict):
        return {
            key: f"sha256:{frames[item]}" if key == "image_url" and item in frames else _logged(item, frames)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_logged(item, frames) for item in value]
    return value


@post(
    "/v1/decisions", status_code=200, before_request=refuse_deep_json,
    responses=error_responses(responses.MODERATION),
)
async def create_decision(
    request: Request[Any, Any, Any],
    data: JSONBody[DecisionRequest],
    settings: NamedDependency[Settings],
    moderation: NamedDependency[ModerationService],
    prefix: NamedDependency[PrefixKeeper],
    question_log: NamedDependency[QuestionLog],
    quotas: NamedDependency[TenantQuotas],
    caller: NamedDependency[Caller],
) -> Response[Decision]:
    """Answer predicate, choice and score questions about an input with the engine's probabilities."""
    request_id = f"decr-{uuid.uuid4().hex}"
    images = image_count(data)
    record = FinishedRequest(request_id, caller.tenant, frames=max(1, images), route="decisions")
    with moderation.recorder.recording(record):
        # an image counts against the keyframe quota as a moderated one does; a text-only input as one
        return await within_quota(
            quotas, caller, max(1, images),
            lambda: cancel_on_disconnect(request, decide_questions(
                moderation, prefix, question_log, settings.engine, caller, data, request_id,
            )),
        )


ROUTES = [create_decision]
