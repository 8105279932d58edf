"""Labels weighed by what was actually labelled: per sampling stratum and week, the decisions it stands for
over the labels it got (issue 48's worked example, with a known truth); several labels of one decision; the
action and the category set scored apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from contracts.decisions import DecisionRow, new_decision_id
from contracts.summaries import ReportPolicy
from quality.labels import (
    label_section,
    label_strata,
    labelled_from_log,
    reviewer_agreement,
    weighted_accuracy,
)

MONDAY = datetime(2026, 11, 30, 9, tzinfo=UTC)  # 2026-W49


def decision(action: str, *, reason: str | None = None, rate: float | None = None,
             categories: tuple[str, ...] = (), at: datetime = MONDAY) -> DecisionRow:
    return DecisionRow(
        decided_at=at, request_id="modr-x", tenant="news", frame_sha256=None, kind="judged", automated=True,
        action=action, categories=list(categories), confidence=0.9, model="m", prompt_version="v1",
        moderation_policy_version=1, thinking="off", thinking_mode="off", review_reason=reason,
        audit_sample_rate=rate, decision_id=new_decision_id(),
    )


def label(of: DecisionRow, action: str, categories: tuple[str, ...] = (), by: str = "alice") -> DecisionRow:
    return DecisionRow(
        decided_at=of.decided_at + timedelta(hours=1), request_id=of.request_id, tenant=of.tenant,
        frame_sha256=None, kind="label", automated=False, action=action, categories=list(categories),
        confidence=None, model=None, prompt_version=None, moderation_policy_version=None, thinking=None,
        labelled_by=by, review_reason=of.review_reason, audit_sample_rate=of.audit_sample_rate,
        decision_id=of.decision_id,
    )


def worked_example() -> tuple[list[DecisionRow], float]:
    """10 000 confident verdicts, 98 % right, audited at 10 % (every audit item labelled); 1 100 unsure ones,
    60 % right, of which only 110 (10 %) were labelled: the rest expired, were skipped or never claimed."""
    rows: list[DecisionRow] = []
    right = wrong = 0
    for n in range(10_000):
        correct = (n // 10) % 50 != 0  # 98 %, of the audited too
        audited = n % 10 == 0
        made = decision("allow", reason="audit" if audited else None, rate=0.1 if audited else None)
        rows.append(made)
        right, wrong = right + correct, wrong + (not correct)
        if audited:
            rows.append(label(made, "allow" if correct else "block", () if correct else ("violence",)))
    for n in range(1_100):
        correct = (n // 10) % 5 < 3  # 60 %, of the labelled too
        made = decision("allow", reason="unsure")
        rows.append(made)
        right, wrong = right + correct, wrong + (not correct)
        if n % 10 == 0:  # labelled: 110 of them, 66 right
            rows.append(label(made, "allow" if correct else "block", () if correct else ("violence",)))
    return rows, right / (right + wrong)


def test_the_worked_example_recovers_the_truth_where_the_old_weights_said_97_6() -> None:
    rows, truth = worked_example()
    assert round(truth * 100, 1) == 94.2
    labelled = labelled_from_log(rows)
    estimate, _ = weighted_accuracy([item.correct for item in labelled], [item.weight for item in labelled])
    assert estimate.value == pytest.approx(truth, abs=1e-9)
    # the old rule (an audit label 1/rate, an unsure one 1, whatever was left unlabelled) says 97.6 %
    old = [10.0 if row.review_reason == "audit" else 1.0 for row in rows if row.kind == "label"]
    before, _ = weighted_accuracy([item.correct for item in labelled], old)
    assert round(before.value * 100, 1) == 97.6


def test_each_stratum_shows_its_queued_labelled_and_weight() -> None:
    rows, _ = worked_example()
    strata = {stratum.reason: stratum for stratum in label_strata(rows)}
    assert set(strata) == {"audit", "unsure"}
    audit, unsure = strata["audit"], strata["unsure"]
    assert (audit.week, audit.audit_sample_rate) == ("2026-W49", 0.1)
    assert (audit.queued, audit.labelled) == (1000, 1000)
    assert audit.weight == pytest.approx(10.0)
    assert (unsure.audit_sample_rate, unsure.queued, unsure.labelled) == (None, 1100, 110)
    assert unsure.weight == 10.0


def test_strata_of_two_weeks_are_weighed_apart() -> None:
    first = [decision("allow", reason="unsure") for _ in range(4)]
    second = [decision("allow", reason="unsure", at=MONDAY + timedelta(days=7)) for _ in range(4)]
    rows = [*first, *second, label(first[0], "allow"), *(label(made, "allow") for made in second)]
    weights = {(s.week, s.weight) for s in label_strata(rows)}
    assert weights == {("2026-W49", 4.0), ("2026-W50", 1.0)}


def test_a_decision_labelled_by_two_reviewers_keeps_both_labels_at_half_its_weight() -> None:
    made = [decision("block", reason="audit", rate=1.0, categories=("violence",)) for _ in range(2)]
    rows = [*made, label(made[0], "block", ("violence",)), label(made[0], "allow", by="bob"),
            label(made[1], "block", ("violence",))]
    labelled = labelled_from_log(rows)
    assert len(labelled) == 3
    assert sorted(item.weight for item in labelled) == [0.5, 0.5, 1.0]
    agreement = reviewer_agreement(rows)
    assert agreement is not None
    assert (agreement.frames, agreement.observed) == (1, 0.0)


def test_reviewers_agreement_is_cohens_kappa_with_its_interval() -> None:
    actions = [("allow", "allow")] * 40 + [("block", "block")] * 40
    actions += [("allow", "block")] * 10 + [("block", "allow")] * 10
    rows = []
    for first, second in actions:
        made = decision("allow", reason="audit", rate=1.0)
        rows += [made, label(made, first, ("violence",) if first == "block" else ()),
                 label(made, second, ("violence",) if second == "block" else (), by="bob")]
    agreement = reviewer_agreement(rows)
    assert agreement is not None
    assert agreement.frames == 100
    assert agreement.kappa == pytest.approx(0.6)  # observed 0.8, by chance 0.5
    assert agreement.low < 0.6 < agreement.high
    section = label_section(labelled_from_log(rows), [], None, ReportPolicy(), label_strata(rows), agreement)
    assert section is not None
    assert section.reviewers == agreement


def test_the_action_and_the_category_set_are_scored_apart() -> None:
    made = [decision("block", reason="audit", rate=1.0, categories=("sexual", "violence")) for _ in range(4)]
    rows = [
        *made,
        label(made[0], "block", ("violence", "sexual")),  # right: the same set, in any order
        label(made[1], "block", ("violence",)),  # the action right, the set wrong
        label(made[2], "block", ("sexual", "violence")),
        label(made[3], "allow"),  # the action wrong: not in the category-set score
    ]
    section = label_section(labelled_from_log(rows), [], None, ReportPolicy(), label_strata(rows))
    assert section is not None
    (arm,) = section.arms
    assert arm.accuracy.value == pytest.approx(0.5)
    assert arm.action_accuracy is not None
    assert arm.action_accuracy.value == pytest.approx(0.75)
    assert arm.category_set_labels == 3
    assert arm.category_set_accuracy is not None
    assert arm.category_set_accuracy.value == pytest.approx(2 / 3)
