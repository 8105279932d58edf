"""A moderation answer's results as decision-log rows, and a human label as one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from contracts.decisions import DecisionKind, DecisionRow
from gateway.wire import ModerationDetails
from shaping.verdict import Action

if TYPE_CHECKING:
    from gateway.review.models import LabelledItem, ReviewItem


def decision_kind(details: ModerationDetails) -> DecisionKind:
    """How the answered verdict was reached."""
    if details.engine_failure is not None:
        return "engine_failure"
    if details.reused is not None:
        return "reused"
    if details.escalated_from is not None:
        return "escalated"
    return "judged"


def decision_row(
    details: ModerationDetails, request_id: str, tenant: str, at: datetime, queued: ReviewItem | None = None
) -> DecisionRow:
    """One result of request ``request_id`` as the log keeps it (the frame's hash, never the frame), with
    the stratum its review item was queued in (``queued``), which the weekly report weighs labels by."""
    return DecisionRow(
        decided_at=at,
        request_id=request_id,
        tenant=tenant,
        frame_sha256=details.frame_sha256,
        kind=decision_kind(details),
        automated=True,
        action=details.action,
        categories=sorted(details.categories),
        confidence=details.confidence,
        model_action=details.model_action,
        moderation_rule=details.moderation_rule,
        model=details.model,
        model_revision=details.model_revision,
        prompt_version=details.prompt_version,
        prompt_sha256=details.prompt_sha256,
        moderation_policy_version=details.moderation_policy_version,
        thinking=details.thinking,
        thinking_mode=details.thinking_mode,
        thinking_rule=details.thinking_rule,
        engine_request_id=details.request_id,
        latency_ms=details.latency_ms,
        review_reason=queued.reason if queued else None,
        audit_sample_rate=queued.audit_sample_rate if queued else None,
        decision_id=details.decision_id,
    )


def label_row(
    request_id: str, tenant: str, frame_sha256: str | None, action: Action, categories: list[str],
    reviewer: str, at: datetime, *, engine_request_id: str | None = None, review_reason: str | None = None,
    audit_sample_rate: float | None = None, decision_id: str | None = None,
) -> DecisionRow:
    """A person's label of an earlier decision (named by its ``decision_id``; a caller without one: by its
    request and frame, or by the engine request that made it): a row of its own, ``automated`` false, so
    the log stays append-only (the decision's row may be in a Parquet file already) and an export holds the
    machine's decision and the person's side by
    side."""
    return DecisionRow(
        decided_at=at, request_id=request_id, tenant=tenant, frame_sha256=frame_sha256, kind="label",
        automated=False, action=action, categories=sorted(categories), confidence=None, model=None,
        prompt_version=None, moderation_policy_version=None, thinking=None,
        engine_request_id=engine_request_id, labelled_by=reviewer, review_reason=review_reason,
        audit_sample_rate=audit_sample_rate, decision_id=decision_id,
    )


def review_label_row(done: LabelledItem) -> DecisionRow:
    """A review queue label as its row: the item names its decision by the verdict's ``decision_id`` (and
    carries the moderation request, the engine request that made the verdict and the frame's hash as the
    decision's row has them); the reviewer as the review audit names them; why the item was queued and the
    audit rate it was offered at."""
    item, label = done.item, done.label
    return label_row(
        item.moderation_request_id or item.request_id, item.tenant, item.frame_sha256, label.action,
        list(label.categories), label.reviewer, datetime.fromtimestamp(label.labelled_at, UTC),
        engine_request_id=item.request_id, review_reason=item.reason,
        audit_sample_rate=item.audit_sample_rate, decision_id=item.decision_id,
    )
