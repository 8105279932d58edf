"""Which frames of a request the engine judges, which repeat an earlier frame, and which verdicts are kept.

A frame reuses a verdict made in the same scope (tenant, the policy's terms of the engine request, thinking
mode, prompt, caller text, the engine's model) for the same shaped bytes ("exact") or a near duplicate
("near"): from the verdict cache, or from an earlier frame of the same request.

The model is that of the engine that made the verdict (its kind is part of it: gateway/engine/wires/).
The engine is chosen after the lookup, so a frame is looked up under the model of every engine in the
pool, since any of them could have taken the request, and nothing else: a verdict made by an engine the
pool does not have, or by weights an engine no longer serves, is never reused (docs/engines.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
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
    """Where a verdict for a frame asked under ``decision`` is looked up."""
    # escalate reuses and keeps verdicts by the engine request that made them: a thinking-on verdict (made
    # under the re-ask's caps) answers an escalate-mode frame as well as any re-ask would; a fast one is
    # kept for thinking-off callers (see verdicts_to_keep)
    asked = decision.reask if decision.mode == "escalate" and decision.reask is not None else decision
    return made_under(
        VerdictScope(
            tenant=tenant,
            policy_terms="",
            thinking="",
            prompt_sha256=prompt_sha256,
            text_sha256=hashlib.sha256(extra_text.encode()).hexdigest() if extra_text else "",
            model=model_scope,
        ),
        asked,
    )


def made_under(scope: VerdictScope, decision: ThinkingDecision) -> VerdictScope:
    """``scope`` for verdicts the engine makes under ``decision``: its thinking mode (escalate's fast ask is
    a thinking-off ask), the digest of what of the policy reaches its request, its verdict format."""
    return replace(
        scope,
        policy_terms=decision.terms_digest(),
        thinking="on" if decision.mode == "on" else "off",
        verdict_format=decision.verdict_format,
    )


def frame_identities(frames: Sequence[ShapedImage], rule: NearDuplicateRule) -> list[FrameIdentity]:
    """Each frame's cache identity (made by the shaping step); the thumbnail only for near duplicates. A
    frame shaped without its pHash (``ModerationService.needs_identity``) is known by its SHA-256 alone."""
    near = rule.enabled
    return [
        FrameIdentity(
            frame.sha256,
            None if frame.phash is None else int(frame.phash, 16),
            frame.thumbnail if near and frame.thumbnail is not None else b"",
        )
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
    scopes: Mapping[str, VerdictScope],
    leaders: Sequence[int],
    outcomes: Sequence[FrameOutcome | None],
    identities: Sequence[FrameIdentity],
    made_at: float,
) -> list[tuple[VerdictScope, StoredVerdict]]:
    """The engine's fresh verdicts, each under the scope of the engine that made it (``scopes`` by engine
    URL: its model's) and of the engine request that made it (an escalated frame's under the re-ask's, a
    fast verdict that stood under a thinking-off ask's); fallback "review" verdicts (unusable output) are
    not kept, nor those of an engine whose model has not been read yet."""
    return [
        (made_under(scopes[made.answer.engine], made.decision),
         StoredVerdict(
            action=made.verdict.action,
            categories=made.verdict.categories,
            confidence=made.verdict.confidence,
            category_scores=made.verdict.category_scores,
            sha256=identities[index].sha256,
            phash=identities[index].looked_up_phash,
            thumbnail=identities[index].thumbnail,
            made_at=made_at,
            request_id=made.answer.request_id,
            policy_version=made.decision.policy_version,
        ))
        for index in leaders
        if (made := outcomes[index]) is not None and made.verdict.problem is None
        and made.answer.engine in scopes
    ]
