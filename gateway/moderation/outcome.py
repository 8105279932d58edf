"""One frame's outcome (the verdict, the engine call that made it, how it was reached) and its wire result."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gateway.engine.answers import EngineAnswer
from gateway.engine.usage import Usage
from gateway.engine.wires import IMAGE_TOKENS_UNCOUNTED
from gateway.errors import ModgateError
from gateway.moderation.verdict_cache import Reuse
from gateway.policy.moderation import PolicyRule, TenantModeration, apply_moderation_policy
from gateway.policy.rules import Mode, ThinkingDecision
from gateway.wire import EscalatedFrom, ModerationDetails, ModerationResult
from shaping.image import ShapedImage
from shaping.verdict import OPENAI_CATEGORIES, Action, KeyframeVerdict, applied_input_types


@dataclass(frozen=True, slots=True)
class FrameOutcome:
    """What one engine call produced for one frame."""

    verdict: KeyframeVerdict
    answer: EngineAnswer
    decision: ThinkingDecision
    queue_s: float
    verdicts: tuple[KeyframeVerdict, ...] = ()  # every frame's verdict of a packed engine call, in order
    reused: Reuse | None = None  # the verdict was not asked of the engine for this frame
    packed: int = 1  # frames in the engine request that judged this one
    thinking_mode: Mode | None = None  # what the policy chose, when it differs from ``decision.mode``
    fast: FrameOutcome | None = None  # escalated: the thinking-off outcome this one replaced
    escalated_from: EscalatedFrom | None = None
    escalation_skipped: Literal["cap_share", "cap_rate", "reask_failed"] | None = None
    model_action: Action | None = None  # the model's action, where the tenant's moderation policy changed it
    moderation_rule: PolicyRule | None = None
    engine_failure: str | None = None  # the engine could not answer: the tenant's policy answered ``review``


@dataclass(frozen=True, slots=True)
class Provenance:
    """What produced a verdict, beside the decision: the model, the prompt, the moderation policy."""

    model: str | None
    model_revision: str | None
    prompt_version: str
    prompt_sha256: str
    moderation_policy_version: int


def under_moderation_policy(outcome: FrameOutcome, policy: TenantModeration) -> FrameOutcome:
    """The outcome with the tenant's moderation policy applied to its verdict (gateway/policy/moderation)."""
    if outcome.engine_failure is not None:
        return outcome
    verdict, rule = apply_moderation_policy(outcome.verdict, policy)
    if rule is None:
        return replace(outcome, verdict=verdict)
    return replace(outcome, verdict=verdict, model_action=outcome.verdict.action, moderation_rule=rule)


def engine_failure_outcome(
    failure: ModgateError, decision: ThinkingDecision, request_id: str
) -> FrameOutcome:
    """``review`` for a frame the engine could not judge, where the tenant's policy fails open to review."""
    answer = EngineAnswer(
        content=None, reasoning=None, finish_reason=None, usage=Usage(), ttft_s=None, total_s=0.0,
        request_id=request_id, streamed=False,
    )
    verdict = KeyframeVerdict(action="review", detail=f"the engine could not answer: {failure.message}")
    return FrameOutcome(verdict=verdict, answer=answer, decision=decision, queue_s=0.0,
                        engine_failure=failure.code)


def packed_share(outcome: FrameOutcome, position: int) -> FrameOutcome:
    """One frame's part of a packed engine call: its own verdict, an even share of the call's tokens."""
    k = outcome.packed
    if k == 1:
        return outcome
    usage = outcome.answer.usage

    def part(total: int) -> int:  # shares that add up to the total: the first frames take the remainder
        return total // k + (1 if position < total % k else 0)

    def part_of_known(total: int | None) -> int | None:
        return None if total is None else part(total)

    shared = Usage(
        prompt_tokens=part(usage.prompt_tokens),
        completion_tokens=part(usage.completion_tokens),
        cached_tokens=part(usage.cached_tokens),
        created_cache_tokens=part(usage.created_cache_tokens),
        image_tokens=part_of_known(usage.image_tokens),
        reasoning_tokens=part(usage.reasoning_tokens),
    )
    verdict = outcome.verdicts[position] if position < len(outcome.verdicts) else outcome.verdict
    return replace(outcome, verdict=verdict, answer=replace(outcome.answer, usage=shared))


def reused_outcome(
    verdict: KeyframeVerdict, how: Reuse, decision: ThinkingDecision, source_request_id: str
) -> FrameOutcome:
    """A verdict not asked of the engine for this frame: no tokens, the engine request that made it."""
    answer = EngineAnswer(
        content=None,
        reasoning=None,
        finish_reason="stop",
        usage=Usage(),
        ttft_s=None,
        total_s=0.0,
        request_id=source_request_id,
        streamed=False,
    )
    return FrameOutcome(verdict=verdict, answer=answer, decision=decision, queue_s=0.0, reused=how)


def moderation_result(
    outcome: FrameOutcome, frame: ShapedImage | None, latency_s: float, shaping_s: float,
    provenance: Provenance | None = None, *, captioned: bool = False,
) -> ModerationResult:
    """The frame's (or the text's) result as the wire has it: OpenAI's fields, then how it was made.
    ``captioned``: the frame was judged with text parts beside it."""
    verdict, answer, decision = outcome.verdict, outcome.answer, outcome.decision
    named = set(verdict.categories)
    usage = answer.usage
    if verdict.category_scores is not None:  # read from the engine's logprobs (shaping.confidence)
        scores = dict(verdict.category_scores)
        category_scores = {c: scores.get(c, 0.0) for c in OPENAI_CATEGORIES}
    else:  # no probabilities: a fixed mark for the categories the verdict names, 0.0 for the rest
        weight = 1.0 if verdict.action == "block" else 0.5
        category_scores = {c: weight if c in named else 0.0 for c in OPENAI_CATEGORIES}
    return ModerationResult(
        flagged=verdict.flagged,
        categories={c: c in named and verdict.action == "block" for c in OPENAI_CATEGORIES},
        category_scores=category_scores,
        category_applied_input_types=applied_input_types(image=frame is not None,
                                                         text=frame is None or captioned),
        modgate=ModerationDetails(
            action=verdict.action,
            reason=verdict.detail or None,
            confidence=verdict.confidence,
            confidence_reason=verdict.confidence_note if verdict.confidence is None else None,
            verdict_format=decision.verdict_format,
            thinking="on" if decision.mode == "on" else "off",
            thinking_rule=decision.rule,
            policy_version=decision.policy_version,
            latency_ms=round(latency_s * 1000, 2),
            queue_ms=round(outcome.queue_s * 1000, 2),
            shaping_ms=round(shaping_s * 1000, 2),
            ttft_ms=None if answer.ttft_s is None else round(answer.ttft_s * 1000, 2),
            decode_ms=None if answer.ttft_s is None else round((answer.total_s - answer.ttft_s) * 1e3, 2),
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            image_tokens=usage.image_tokens,
            image_tokens_reason=None if usage.image_tokens is not None else IMAGE_TOKENS_UNCOUNTED,
            completion_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            frame_sha256=frame.sha256 if frame else None,
            reused=outcome.reused,
            request_id=answer.request_id,
            thinking_mode=outcome.thinking_mode or decision.mode,
            escalated_from=outcome.escalated_from,
            escalation_skipped=outcome.escalation_skipped,
            model=provenance.model if provenance else None,
            model_revision=provenance.model_revision if provenance else None,
            prompt_version=provenance.prompt_version if provenance else None,
            prompt_sha256=provenance.prompt_sha256 if provenance else None,
            moderation_policy_version=provenance.moderation_policy_version if provenance else None,
            categories=list(verdict.categories),
            model_action=outcome.model_action,
            moderation_rule=outcome.moderation_rule,
            engine_failure=outcome.engine_failure,
        ),
    )
