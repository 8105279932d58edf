"""Which frames of a request the engine judges, which repeat an earlier frame, and which verdicts are kept.

A frame reuses a verdict made in the same scope (tenant, policy version, thinking mode, prompt, caller text,
the engine's model) for the same shaped bytes ("exact") or a near duplicate ("near"): from the verdict cache,
or from an earlier frame of the same request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gateway.moderation.outcome import FrameOutcome
from gateway.moderation.verdict_cache import (
    FrameIdentity,
    NearDuplicateRule,
    Reuse,
    ReusedVerdict,
    StoredVerdict,
    VerdictScope,
)
from gateway.policy.rules import ThinkingDecision
from shaping.image import ShapedImage


def verdict_scope(
    tenant: str, decision: ThinkingDecision, extra_text: str, prompt_sha256: str, model_scope: str
) -> VerdictScope:
    """Where a verdict made under ``decision`` is looked up and kept."""
    # escalate reuses and keeps verdicts by the mode that made them: a thinking-on verdict answers an
    # escalate-mode frame as well as any re-ask would; a fast one is kept for thinking-off callers
    return VerdictScope(
        tenant=tenant,
        policy_version=decision.policy_version,
        thinking="on" if decision.mode == "escalate" else decision.mode,
        prompt_sha256=prompt_sha256,
        text_sha256=hashlib.sha256(extra_text.encode()).hexdigest() if extra_text else "",
        model=model_scope,
        verdict_format=decision.verdict_format,
    )


def frame_identities(frames: Sequence[ShapedImage], rule: NearDuplicateRule) -> list[FrameIdentity]:
    """Each frame's cache identity (made by the shaping step); the thumbnail only for near duplicates."""
    near = rule.enabled
    return [
        FrameIdentity(frame.sha256, int(frame.phash, 16), frame.thumbnail if near else b"")
        for frame in frames
    ]


@dataclass(slots=True)
class FramePlan:
    """The frames the engine judges (``leaders``), and each repeat's earlier frame and kind of reuse."""

    leaders: list[int] = field(default_factory=list)
    followers: dict[int, tuple[int, Reuse]] = field(default_factory=dict)


def plan_frames(
    identities: Sequence[FrameIdentity], hits: Sequence[ReusedVerdict | None], rule: NearDuplicateRule
) -> FramePlan:
    """Split the frames the cache did not answer into leaders and the repeats of an earlier leader."""
    plan = FramePlan()
    for index, identity in enumerate(identities):
        if hits[index] is not None:
            continue
        twin: tuple[int, Reuse] | None = None
        for leader in plan.leaders:
            if identities[leader].sha256 == identity.sha256:
                twin = (leader, "exact")
                break
            if twin is None and rule.matches(identity, identities[leader]) is not None:
                twin = (leader, "near")
        if twin is None:
            plan.leaders.append(index)
        else:
            plan.followers[index] = twin
    return plan


def verdicts_to_keep(
    scope: VerdictScope,
    leaders: Sequence[int],
    outcomes: Sequence[FrameOutcome | None],
    identities: Sequence[FrameIdentity],
    made_at: float,
) -> list[tuple[VerdictScope, StoredVerdict]]:
    """The engine's fresh verdicts, each under the scope of the mode that made it; fallback "review"
    verdicts (unusable output) are not kept."""
    return [
        (replace(scope, thinking="off" if made.decision.mode == "escalate" else made.decision.mode),
         StoredVerdict(
            action=made.verdict.action,
            categories=made.verdict.categories,
            confidence=made.verdict.confidence,
            category_scores=made.verdict.category_scores,
            sha256=identities[index].sha256,
            phash=identities[index].phash,
            thumbnail=identities[index].thumbnail,
            made_at=made_at,
            request_id=made.answer.request_id,
        ))
        for index in leaders
        if (made := outcomes[index]) is not None and made.verdict.problem is None
    ]
