"""The review queue's vocabulary: an item, a reviewer's label, the queue's figures, and its conflicts."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from gateway.errors import Conflict
from gateway.review.selection import ReviewReason
from shaping.verdict import Action

ConflictKind = Literal["labelled", "gone", "claimed", "unclaimed"]

_CONFLICT_MESSAGES: Final[dict[ConflictKind, str]] = {
    "labelled": "review item {id} is already labelled",
    "gone": "review item {id} is not in the queue: it expired (retention passed) or never existed",
    "claimed": "review item {id} is claimed by another reviewer",
    "unclaimed": "review item {id} is not claimed by you: claim it first (POST /admin/review/claim)",
}


class ReviewConflict(Conflict):
    """A label or skip the item's state refuses: 409 in the OpenAI error shape."""

    def __init__(self, item_id: str, kind: ConflictKind) -> None:
        super().__init__(_CONFLICT_MESSAGES[kind].format(id=item_id), code=f"review_item_{kind}")
        self.kind = kind


def new_item_id() -> str:
    """A fresh item id."""
    return f"rev-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class ReviewItem:
    """One frame waiting for people: the shaped frame and what the model said of it."""

    id: str
    tenant: str
    frame: str = field(repr=False)  # the shaped frame as a data: URL (kept only for the item's life)
    action: Action
    categories: tuple[str, ...]
    confidence: float | None
    reason: ReviewReason
    audit_sample_rate: float  # the rate it was sampled at (weights an audit label: 1/rate)
    thinking: Literal["on", "off"]
    reasoning: str | None  # the model's reasoning text when thinking was on
    request_id: str
    enqueued_at: float  # unix seconds
    model: str = ""
    job_id: str | None = None  # the async job whose result the label is written beside
    frame_sha256: str | None = None  # the frame's hash as the decision log names it (the label's row too)
    decision_id: str | None = None  # the verdict's own id (``modgate.decision_id``): its label joins by it
    moderation_request_id: str | None = None  # the moderation request (``modr-…``) that answered it

    @property
    def decision_key(self) -> str:
        """The decision this item is a label of: shared by a double-labelled decision's two items (its
        ``decision_id``; else its request and frame; an item naming neither is a decision of its own)."""
        if self.decision_id is not None:
            return self.decision_id
        if self.frame_sha256 is not None:
            return f"{self.tenant}/{self.request_id}/{self.frame_sha256}"
        return self.id

    def to_hash(self) -> dict[str, str]:
        """Flat string fields (a Redis hash)."""
        return {name: json.dumps(value) for name, value in asdict(self).items()}

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> ReviewItem:
        """Back from :meth:`to_hash` (bytes or str keys and values); fields not stored take their default."""
        decoded = {_text(name): json.loads(_text(value)) for name, value in raw.items()}
        names = set(cls.__dataclass_fields__)
        values = {name: value for name, value in decoded.items() if name in names}
        values.setdefault("frame", "")
        values["categories"] = tuple(values["categories"])
        return cls(**values)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class Label:
    """A reviewer's decision on one item."""

    action: Action
    categories: tuple[str, ...]
    reviewer: str
    labelled_at: float


@dataclass(frozen=True, slots=True)
class LabelledItem:
    """An item once labelled: what the model said (the frame is gone) and what the reviewer decided."""

    item: ReviewItem
    label: Label

    @property
    def agrees(self) -> bool:
        """Whether the human decision is the model's (action, and categories for a block)."""
        if self.label.action != self.item.action:
            return False
        return self.label.action != "block" or set(self.label.categories) == set(self.item.categories)


def audit_entry(item: ReviewItem, label: Label) -> dict[str, Any]:
    """The audit trail's record of one label: who decided what, on which item, beside the model's verdict."""
    done = LabelledItem(item, label)
    return {
        "at": label.labelled_at,
        "reviewer": label.reviewer,
        "item_id": item.id,
        "tenant": item.tenant,
        "request_id": item.request_id,
        "decision_id": item.decision_id,
        "job_id": item.job_id,
        "reason": item.reason,
        "audit_sample_rate": item.audit_sample_rate,
        "thinking": item.thinking,
        "model": {"action": item.action, "categories": list(item.categories), "confidence": item.confidence},
        "label": {"action": label.action, "categories": list(label.categories)},
        "agrees": done.agrees,
    }


@dataclass(frozen=True, slots=True)
class QueuedItem:
    """An item still in the queue (frame included), and the reviewer who holds it now (None: nobody)."""

    item: ReviewItem
    holder: str | None


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """One tenant's queue: items waiting or claimed, how many are claimed, the oldest's age."""

    depth: int
    claimed: int
    oldest_age_s: float | None
