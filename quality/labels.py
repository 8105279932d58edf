"""The week's decisions against people's labels (the decision log), and the escalation threshold they choose.

A label in the review queue is not a random draw: every ``review`` verdict and every verdict under the
review threshold is queued (``unsure``), and of the rest only an audit sample at rate r. So each label
weighs what it stands for (Horvitz-Thompson): an audit label 1/r decisions, an ``unsure`` or ``review``
one itself. Accuracy is the weighted share of labels the decision agreed with (the Hajek ratio
sum(w * correct) / sum(w)); its interval is Wilson's on that share with Kish's effective number of labels
n_eff = (sum w)^2 / sum w^2, the rule the escalation section already uses for its weighted sample. A week
of audit labels only, at one rate, has n_eff = n: the plain Wilson interval.

Where enough labelled frames also have a thinking-on and a thinking-off verdict (the week's shadow or
offline pairs), the escalation threshold is chosen from labels: the accuracy of the escalated answer
(thinking on below the threshold, thinking off above it) at each threshold, and the best one that
escalates no more than the agreement-chosen threshold does. Plain CPU work: no I/O.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from statsmodels.stats.proportion import proportion_confint

from contracts.decisions import DecisionRow, labelled_decisions
from contracts.summaries import (
    Estimate,
    LabelAccuracy,
    LabelSection,
    LabelThreshold,
    Rate,
    ReportPolicy,
    TenantDecisionRow,
    ThresholdRow,
    ThresholdSection,
)
from quality.escalation import default_thresholds, same_verdict

__all__ = [
    "LabelledDecision",
    "LabelledPair",
    "label_headline",
    "label_section",
    "label_weight",
    "labelled_from_log",
    "tenant_decision_rows",
    "threshold_from_labels",
    "weighted_accuracy",
]

FloatArray = NDArray[np.float64]


def label_weight(reason: str | None, audit_sample_rate: float | None) -> float:
    """What one label stands for: 1/rate for an audit sample, 1 for a frame queued whatever the draw."""
    if reason == "audit" and audit_sample_rate is not None and audit_sample_rate > 0:
        return 1.0 / audit_sample_rate
    return 1.0


def weighted_accuracy(
    correct: Sequence[bool] | NDArray[np.bool_],
    weights: Sequence[float] | FloatArray,
    confidence: float = 0.95,
) -> tuple[Estimate, float]:
    """The weighted share correct with its Wilson interval on Kish's effective n, and that n."""
    hits = np.asarray(correct, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    total, squares = float(w.sum()), float((w**2).sum())
    if hits.size == 0 or total <= 0:
        raise ValueError("a weighted accuracy needs at least one label of positive weight")
    value = float((w * hits).sum() / total)
    n_eff = total**2 / squares
    low, high = proportion_confint(value * n_eff, n_eff, alpha=1 - confidence, method="wilson")
    return Estimate(
        value=value, low=max(0.0, min(float(low), value)), high=min(1.0, max(float(high), value))
    ), n_eff


@dataclass(frozen=True, slots=True)
class LabelledDecision:
    """One decision a person labelled: its arm and engine, what each named, and what the label weighs."""

    arm: str
    engine: str
    tenant: str
    frame_sha256: str | None
    categories: frozenset[str]  # named by the model or the person
    correct: bool
    weight: float
    label_action: str
    label_categories: tuple[str, ...]


def _arm(row: DecisionRow) -> str:
    """The thinking mode the policy chose for the frame (an older row: how its verdict was made)."""
    if row.thinking_mode is not None:
        return row.thinking_mode
    return "escalate" if row.kind == "escalated" else (row.thinking or "unknown")


def labelled_from_log(rows: Iterable[DecisionRow]) -> list[LabelledDecision]:
    """Each labelled decision of the log (a label beside the decision it names), weighted."""
    _, pairs = labelled_decisions(rows)
    return [
        LabelledDecision(
            arm=_arm(decision),
            engine=decision.model or "unknown",
            tenant=decision.tenant,
            frame_sha256=decision.frame_sha256,
            categories=frozenset(decision.categories) | frozenset(label.categories),
            correct=same_verdict(label.action, label.categories, decision.action, decision.categories),
            weight=label_weight(label.review_reason, label.audit_sample_rate),
            label_action=label.action,
            label_categories=tuple(label.categories),
        )
        for decision, label in pairs
    ]


def _accuracy_rows(
    labelled: Sequence[LabelledDecision], confidence: float, *, by_category: bool
) -> list[LabelAccuracy]:
    groups: dict[tuple[str, str, str | None], list[LabelledDecision]] = defaultdict(list)
    for item in labelled:
        if by_category:
            for named in item.categories:
                groups[(item.arm, item.engine, named)].append(item)
        else:
            groups[(item.arm, item.engine, None)].append(item)
    rows = []
    for (arm, engine, category), items in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")
    ):
        estimate, n_eff = weighted_accuracy([i.correct for i in items], [i.weight for i in items], confidence)
        rows.append(
            LabelAccuracy(
                arm=arm,
                engine=engine,
                category=category,
                labels=len(items),
                effective_labels=n_eff,
                accuracy=estimate,
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class LabelledPair:
    """A labelled frame the week also judged both ways: the fast verdict's confidence, whether each
    verdict is the person's, and its weight (the label's, over the chance the frame was paired)."""

    confidence: float | None
    off_correct: bool
    on_correct: bool
    forced: bool  # names a category the policy always escalates
    weight: float


def threshold_from_labels(
    pairs: Sequence[LabelledPair],
    budget: float | None,
    confidence: float = 0.95,
    thresholds: Sequence[float] | None = None,
) -> tuple[list[ThresholdRow], ThresholdRow | None]:
    """Per threshold, the share escalated and the escalated answer's accuracy against labels; the most
    accurate threshold that escalates at most ``budget`` (the lowest of equals: the cheapest)."""
    if not pairs:
        return [], None
    conf = np.asarray([math.nan if p.confidence is None else p.confidence for p in pairs], dtype=np.float64)
    grid = np.asarray(thresholds, dtype=np.float64) if thresholds is not None else default_thresholds(conf)
    off = np.asarray([p.off_correct for p in pairs])
    on = np.asarray([p.on_correct for p in pairs])
    forced = np.asarray([p.forced for p in pairs])
    weights = np.asarray([p.weight for p in pairs], dtype=np.float64)
    rows = []
    for threshold in grid:
        escalated = forced | (np.nan_to_num(conf, nan=-1.0) < threshold) | (threshold >= 1)
        share, _ = weighted_accuracy(escalated, weights, confidence)
        accuracy, _ = weighted_accuracy(np.where(escalated, on, off), weights, confidence)
        rows.append(
            ThresholdRow(threshold=float(threshold), escalated=share, agreement=accuracy, recovered=None)
        )
    allowed = [row for row in rows if budget is None or row.escalated.value <= budget + 1e-12]
    best = max(allowed, key=lambda row: (row.agreement.value, -row.threshold), default=None)
    return rows, best


def _threshold_choice(
    pairs: Sequence[LabelledPair], escalation: ThresholdSection | None, policy: ReportPolicy
) -> LabelThreshold:
    budget = escalation.recommended.escalated.value if escalation and escalation.recommended else None
    rows, best = threshold_from_labels(pairs, budget, policy.confidence)
    n, needed = len(pairs), policy.min_threshold_labels
    if n >= needed and best is not None:
        note = (
            f"Escalation threshold from human labels (n={n}): escalate below {best.threshold:.3g}, "
            f"{best.escalated.value * 100:.0f} % escalated, accuracy {best.agreement.value * 100:.1f} % "
            f"[{best.agreement.low * 100:.1f}, {best.agreement.high * 100:.1f}]"
        )
        note += (
            "."
            if budget is None
            else f" (no more escalated than thinking-on agreement's {budget * 100:.0f} %)."
        )
        return LabelThreshold(
            source="labels",
            labels=n,
            min_labels=needed,
            budget=budget,
            rows=rows,
            recommended=best,
            note=note,
        )
    chosen = escalation.recommended if escalation else None
    where = f"escalate below {chosen.threshold:.3g}" if chosen else "no threshold recommended"
    note = (
        f"Escalation threshold from thinking-on agreement ({where}): {n} labelled frames judged both "
        f"ways this week, {needed} needed to choose it from human labels."
    )
    return LabelThreshold(
        source="agreement",
        labels=n,
        min_labels=needed,
        budget=budget,
        rows=rows,
        recommended=chosen,
        note=note,
    )


def label_section(
    labelled: Sequence[LabelledDecision],
    pairs: Sequence[LabelledPair],
    escalation: ThresholdSection | None,
    policy: ReportPolicy,
) -> LabelSection | None:
    """Accuracy per arm and engine, overall and per category, and the threshold's source; None without
    labels."""
    if not labelled:
        return None
    return LabelSection(
        labels=len(labelled),
        arms=_accuracy_rows(labelled, policy.confidence, by_category=False),
        categories=_accuracy_rows(labelled, policy.confidence, by_category=True),
        threshold=_threshold_choice(pairs, escalation, policy),
    )


_ARM_NAMES = {"off": "thinking off", "on": "thinking on", "escalate": "escalate"}


def label_headline(section: LabelSection) -> str:
    """The headline's sentence: each arm's accuracy against people, and where the threshold came from."""
    arms = "; ".join(
        f"{_ARM_NAMES.get(row.arm, row.arm)} ({row.engine}) {row.accuracy.value * 100:.1f} % "
        f"[{row.accuracy.low * 100:.1f}, {row.accuracy.high * 100:.1f}] over {row.labels}"
        for row in section.arms
    )
    weighted = f"Against {section.labels} human labels (weighted for the audit rate)"
    return f"{weighted}: {arms}. {section.threshold.note}"


def labelled_pairs(
    labelled: Sequence[LabelledDecision],
    verdicts: dict[str, dict[str, tuple[str, tuple[str, ...], float | None, float | None]]],
    always: Collection[str],
) -> list[LabelledPair]:
    """The labelled frames judged both ways: ``verdicts[frame][arm]`` is (action, categories, confidence,
    selection probability) of its ``thinking_off`` and ``thinking_on`` records."""
    pairs = []
    for item in labelled:
        both = verdicts.get(item.frame_sha256 or "", {})
        off, on = both.get("thinking_off"), both.get("thinking_on")
        if off is None or on is None:
            continue
        chance = off[3] or on[3] or 1.0
        pairs.append(
            LabelledPair(
                confidence=off[2],
                off_correct=same_verdict(item.label_action, item.label_categories, off[0], off[1]),
                on_correct=same_verdict(item.label_action, item.label_categories, on[0], on[1]),
                forced=bool(set(off[1]) & set(always)),
                weight=item.weight / chance,
            )
        )
    return pairs


def tenant_decision_rows(rows: Iterable[DecisionRow], confidence: float = 0.95) -> list[TenantDecisionRow]:
    """Per tenant: its decisions, the share blocked (Wilson), the share answered review, labels' agreement."""
    from contracts.decisions import tenant_decisions
    from quality.stats import wilson_interval

    figures = []
    for tenant in tenant_decisions(rows):
        block_rate = None
        if tenant.decisions and tenant.block_share is not None:
            blocked = round(tenant.block_share * tenant.decisions)
            interval = wilson_interval(blocked, tenant.decisions, confidence)
            block_rate = Rate(
                k=blocked,
                n=tenant.decisions,
                value=interval.value,
                wilson_low=interval.low,
                wilson_high=interval.high,
            )
        figures.append(
            TenantDecisionRow(
                tenant=tenant.tenant,
                decisions=tenant.decisions,
                block_rate=block_rate,
                review_share=tenant.review_share,
                labelled=tenant.labelled,
                label_agreement=tenant.label_agreement,
            )
        )
    return figures
