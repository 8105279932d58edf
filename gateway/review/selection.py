"""Which frames go to the review queue: one small rule, fed per tenant by the moderation policy."""

from __future__ import annotations

import random
from typing import Literal, Protocol

from shaping.verdict import Action

ReviewReason = Literal["review", "unsure", "audit"]
"""Why an item is queued: the model said ``review``; its confidence was under the threshold; sampled."""


class UnitRandom(Protocol):
    """A source of uniform numbers in [0, 1) (``random.Random``; tests pass a seeded one)."""

    def random(self) -> float: ...


def review_reason(
    action: Action,
    confidence: float | None,
    review_below: float,
    audit_sample_rate: float,
    rng: UnitRandom | None = None,
) -> ReviewReason | None:
    """Why this verdict goes to people, or None.

    A ``review`` verdict always does; a verdict whose confidence is under ``review_below`` does (no
    confidence at all counts as unsure only when the threshold is on, i.e. above 0); any other verdict is
    sampled for audit at ``audit_sample_rate``, so accuracy is measured on what the model is sure of too.
    """
    if action == "review":
        return "review"
    if review_below > 0 and (confidence is None or confidence < review_below):
        return "unsure"
    if audit_sample_rate > 0 and (rng or random).random() < audit_sample_rate:
        return "audit"
    return None
