"""Escalate mode: a fast (thinking-off) verdict the model was unsure of is asked again with thinking on."""

from __future__ import annotations

import logging
from dataclasses import replace

from contracts.escalation_rule import escalation_reason
from gateway.errors import ModgateError
from gateway.moderation.engine_call import FrameJudge
from gateway.moderation.outcome import FrameOutcome
from gateway.policy.rules import EscalationBudget, RequestContext, ThinkingDecision
from gateway.series.metrics import GatewayMetrics
from gateway.telemetry.recorder import VerdictRecorder
from gateway.wire import EscalatedFrom
from shaping.image import ShapedImage

log = logging.getLogger("modgate.moderation")


class Escalation:
    """Re-asks unsure fast verdicts within the policy's caps (per replica)."""

    def __init__(self, judge: FrameJudge, budget: EscalationBudget, metrics: GatewayMetrics) -> None:
        self.judge = judge
        self.budget = budget
        self.figures = VerdictRecorder(metrics)

    async def answer(
        self,
        frame: ShapedImage,
        fast: FrameOutcome | None,
        user_text: str,
        decision: ThinkingDecision,
        context: RequestContext,
        request_id: str,
    ) -> FrameOutcome | None:
        """An escalate-mode frame's answer: its fast verdict, or the thinking-on one if it was unsure.

        The cap is checked and the frame counted in the same step (no await between), so concurrent
        requests on this replica never overrun it together.
        """
        rule, reask = decision.escalation, decision.reask
        if fast is None or rule is None or reask is None:
            return fast
        verdict = fast.verdict
        why = escalation_reason(
            verdict.action, verdict.categories, verdict.confidence, rule.threshold, rule.always_categories
        )
        if why is None:
            self.budget.record(False)
            return fast
        skipped = self.budget.skip_reason(rule)
        self.budget.record(skipped is None)
        if skipped is not None:
            self.figures.not_escalated(skipped)
            return replace(fast, escalation_skipped=skipped)
        self.figures.escalated(why)
        try:
            again = await self.judge.judge(
                [frame], user_text, reask, context, f"{request_id}-escalated", reask=True
            )
        except ModgateError as exc:  # the fast verdict still answers; the caller is told it was not re-asked
            self.figures.not_escalated("reask_failed")
            log.warning("escalation re-ask failed: %s", exc.message, extra={"request_id": request_id})
            return replace(fast, escalation_skipped="reask_failed")
        return replace(
            again,
            queue_s=fast.queue_s + again.queue_s,
            thinking_mode="escalate",
            fast=fast,
            escalated_from=EscalatedFrom(
                action=verdict.action,
                categories=list(verdict.categories),
                confidence=verdict.confidence,
                why=why,
                threshold=rule.threshold,
                request_id=fast.answer.request_id,
            ),
        )
