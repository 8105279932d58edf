"""The escalation rule: why a fast verdict is re-asked with thinking on.

Kept apart from :mod:`quality.escalation` (which picks the rule's threshold with the statistics extra) so
the gateway applies the rule with the runtime install alone.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

EscalationReason = Literal["review", "low_confidence", "no_confidence", "category"]
ESCALATION_REASONS: tuple[EscalationReason, ...] = ("review", "low_confidence", "no_confidence", "category")


def escalation_reason(
    action: str,
    categories: Collection[str],
    confidence: float | None,
    threshold: float,
    always: Collection[str] = (),
) -> EscalationReason | None:
    """Why a fast verdict is re-asked with thinking on, or None when it stands.

    A verdict without a confidence (the engine gave no probabilities) cannot show it is sure: it escalates.
    A threshold of 1 escalates every frame (logprobs round a near-certain answer to exactly 1).
    """
    if action == "review":
        return "review"
    if any(category in always for category in categories):
        return "category"
    if confidence is None:
        return "no_confidence"
    if confidence < threshold or threshold >= 1:
        return "low_confidence"
    return None
