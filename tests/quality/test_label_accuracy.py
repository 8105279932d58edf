"""Accuracy against people's labels (the decision log): Horvitz-Thompson weights for audit samples, the
interval on Kish's effective n, where the escalation threshold comes from, and the per-tenant split."""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import norm
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import DescrStatsW

from contracts.decisions import DecisionRow
from contracts.records import Arm, VerdictRecord
from contracts.summaries import Estimate, ThresholdRow, ThresholdSection
from gateway.decisions.rows import label_row
from quality.columnar import records_table, write_week_partition
from quality.labels import (
    LabelledPair,
    label_section,
    label_weight,
    labelled_from_log,
    threshold_from_labels,
    weighted_accuracy,
)
from quality.report import ReportPolicy, build_weekly_report_from, render_html
from shaping.verdict import Action

AT = datetime(2026, 11, 25, 12, tzinfo=UTC)  # in 2026-W48


def test_an_audit_label_stands_for_one_over_its_rate_and_a_queued_one_for_itself() -> None:
    assert label_weight("audit", 0.05) == pytest.approx(20.0)
    assert label_weight("unsure", 0.05) == 1.0
    assert label_weight("review", 0.05) == 1.0
    assert label_weight(None, None) == 1.0  # a label without its reason (an older row): itself


def test_the_weighted_accuracy_is_the_horvitz_thompson_ratio_with_wilson_on_kishs_effective_n() -> None:
    # 10 audit labels at rate 0.1 (each stands for 10 confident decisions), 9 of them agreed with; 5 unsure
    # ones (all queued, each stands for itself), none agreed with: 90 of the 105 decisions they stand for
    correct = [True] * 9 + [False] + [False] * 5
    weights = [10.0] * 10 + [1.0] * 5
    estimate, n_eff = weighted_accuracy(correct, weights)
    assert estimate.value == pytest.approx(90 / 105)
    assert estimate.value == pytest.approx(DescrStatsW(np.asarray(correct, float), weights=weights).mean)
    assert n_eff == pytest.approx(105**2 / (10 * 100 + 5))
    # Wilson's score interval on (p, n_eff), written out
    z = norm.ppf(0.975)
    p, n = 90 / 105, n_eff
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / (1 + z**2 / n)
    assert (estimate.low, estimate.high) == pytest.approx((centre - half, centre + half))
    assert estimate.value > 9 / 15  # unweighted, the unsure labels would drag it to 60 %


def test_labels_of_one_weight_give_the_plain_wilson_interval() -> None:
    estimate, n_eff = weighted_accuracy([True] * 47 + [False] * 3, [20.0] * 50)
    low, high = proportion_confint(47, 50, alpha=0.05, method="wilson")
    assert n_eff == pytest.approx(50)
    assert (estimate.value, estimate.low, estimate.high) == pytest.approx((0.94, low, high))


def test_the_weighted_estimate_recovers_a_known_accuracy_from_a_biased_queue() -> None:
    # 200,000 decisions: 95 % confident and right 99 % of the time, 5 % unsure and right 60 % of the time;
    # every unsure one is labelled, confident ones are audited at 2 %
    rng = np.random.default_rng(5)
    unsure = rng.random(200_000) < 0.05
    right = np.where(unsure, rng.random(200_000) < 0.60, rng.random(200_000) < 0.99)
    audited = ~unsure & (rng.random(200_000) < 0.02)
    queued = unsure | audited
    weights = np.where(unsure, 1.0, 1 / 0.02)[queued]
    estimate, _ = weighted_accuracy(right[queued], weights)
    truth = float(right.mean())
    assert estimate.low <= truth <= estimate.high
    assert float(right[queued].mean()) < estimate.low  # the unweighted share is biased low, outside it


def pairs_with(confidences: list[float], wrong_below: float) -> list[LabelledPair]:
    """Thinking off wrong below a confidence and right above it; thinking on always right."""
    return [
        LabelledPair(confidence=c, off_correct=c >= wrong_below, on_correct=True, forced=False, weight=1.0)
        for c in confidences
    ]


def test_labels_choose_the_most_accurate_threshold_within_the_escalation_budget() -> None:
    pairs = pairs_with([0.55, 0.65, 0.75, 0.85, 0.95], wrong_below=0.7)
    grid = [0.5, 0.6, 0.7, 0.8, 0.9]
    rows, best = threshold_from_labels(pairs, budget=None, thresholds=grid)
    assert [row.agreement.value for row in rows] == pytest.approx([0.6, 0.8, 1.0, 1.0, 1.0])
    assert best is not None
    assert best.threshold == 0.7  # the cheapest of the most accurate
    _, capped = threshold_from_labels(pairs, budget=0.2, thresholds=grid)
    assert capped is not None
    assert (capped.threshold, capped.escalated.value) == (0.6, 0.2)


def agreement_section(threshold: float, escalated: float) -> ThresholdSection:
    """The agreement-chosen threshold (what the report's escalation section recommends)."""
    row = ThresholdRow(
        threshold=threshold,
        escalated=Estimate(value=escalated, low=escalated, high=escalated),
        agreement=Estimate(value=0.99, low=0.98, high=1.0),
        recovered=None,
    )
    return ThresholdSection(
        sample="random",
        pairs=100,
        videos=10,
        effective_pairs=100,
        escalation_pairs=0,
        without_confidence=0,
        always_escalate=[],
        target_agreement=0.99,
        disagreement=Estimate(value=0.1, low=0.05, high=0.15),
        auroc=None,
        rows=[row],
        recommended=row,
        recommendation="",
    )


def decision(index: int, *, tenant: str = "news", action: Action = "allow", mode: str = "off") -> DecisionRow:
    return DecisionRow(
        decided_at=AT + timedelta(minutes=index),
        request_id=f"modr-{index}",
        tenant=tenant,
        frame_sha256=frame(index),
        kind="judged",
        automated=True,
        action=action,
        categories=["violence"] if action == "block" else [],
        confidence=0.9,
        model="m",
        prompt_version="v",
        moderation_policy_version=1,
        thinking="on" if mode == "on" else "off",
        thinking_mode=mode,
        engine_request_id=f"modr-{index}-0",
    )


def frame(index: int) -> str:
    return hashlib.sha256(f"frame-{index}".encode()).hexdigest()


def label(row: DecisionRow, action: Action, reason: str = "audit", rate: float = 0.5) -> DecisionRow:
    return label_row(
        row.request_id,
        row.tenant,
        row.frame_sha256,
        action,
        ["violence"] if action == "block" else [],
        "alice (admin:1)",
        row.decided_at + timedelta(hours=1),
        engine_request_id=row.engine_request_id,
        review_reason=reason,
        audit_sample_rate=rate,
    )


def test_the_report_says_the_threshold_came_from_labels_only_with_enough_of_them() -> None:
    pairs = pairs_with([0.55, 0.65, 0.75, 0.85, 0.95], wrong_below=0.7)
    rows = [decision(i) for i in range(5)]
    labelled = labelled_from_log([*rows, *(label(row, "allow") for row in rows)])
    escalation = agreement_section(0.8, escalated=0.6)
    enough = label_section(labelled, pairs, escalation, ReportPolicy(min_threshold_labels=5))
    assert enough is not None
    assert enough.threshold.source == "labels"
    assert "threshold from human labels (n=5)" in enough.threshold.note
    chosen = enough.threshold.recommended  # the cheapest threshold that re-asks both of thinking off's errors
    assert chosen is not None
    assert 0.65 < chosen.threshold <= 0.75
    assert chosen.escalated.value == 0.4
    assert enough.threshold.budget == 0.6
    few = label_section(labelled, pairs, escalation, ReportPolicy(min_threshold_labels=6))
    assert few is not None
    assert few.threshold.source == "agreement"
    assert "from thinking-on agreement" in few.threshold.note
    assert "6 needed" in few.threshold.note
    assert few.threshold.recommended == escalation.recommended


def record(
    index: int, arm: Arm, action: Action, tenant: str, confidence: float | None = None
) -> VerdictRecord:
    return VerdictRecord(
        frame_sha256=frame(index),
        video_id=f"v{index // 4}",
        tenant=tenant,
        arm=arm,
        action=action,
        flagged=action != "allow",
        categories=["violence"] if action == "block" else [],
        policy_version=1,
        prompt_tokens=300,
        cached_tokens=280,
        completion_tokens=4,
        reasoning_tokens=0,
        latency_ms=100.0,
        recorded_at=AT + timedelta(minutes=index, seconds=1 if arm == "thinking_off" else 0),
        source="shadow",
        request_id=f"modr-{index}",
        confidence=confidence,
        selection_probability=1.0,
    )


@pytest.mark.parametrize("stored", ["table", "parquet"])
def test_the_week_scores_arms_against_log_labels_chooses_the_threshold_from_them_and_splits_tenants(
    stored: str, tmp_path: Path
) -> None:
    # 40 frames of news, 40 of kids; thinking on blocks every fourth frame; thinking off (confidence from 0.5
    # up) misses the blocks of its least confident frames; the person agrees with thinking on everywhere
    records, rows = [], []
    for i in range(80):
        tenant = "news" if i < 40 else "kids"
        blocked = i % 4 == 0
        confidence = 0.5 + (i % 40) / 80
        off: Action = "block" if blocked and confidence >= 0.7 else "allow"
        records += [
            record(i, "thinking_on", "block" if blocked else "allow", tenant),
            record(i, "thinking_off", off, tenant, confidence),
        ]
        decided = decision(i, tenant=tenant, action=off, mode="off")
        rows += [decided, label(decided, "block" if blocked else "allow", rate=1.0)]
    policy = ReportPolicy(bootstrap_resamples=100, min_threshold_labels=50)
    source: Path | pa.Table = records_table(records)
    if stored == "parquet":  # a week's partition on disk, as the report reads a stored week
        write_week_partition(source, tmp_path / "week=2026-W48")
        source = tmp_path / "week=2026-W48"
    report = build_weekly_report_from(source, "2026-W48", policy, decisions=rows, isolate=False)
    assert report.labels is not None
    (arm,) = report.labels.arms
    missed = sum(1 for i in range(80) if i % 4 == 0 and 0.5 + (i % 40) / 80 < 0.7)
    assert (arm.arm, arm.labels) == ("off", 80)
    assert arm.accuracy.value == pytest.approx((80 - missed) / 80)
    assert {row.category for row in report.labels.categories} == {"violence"}
    threshold = report.labels.threshold
    assert (threshold.source, threshold.labels) == ("labels", 80)
    assert threshold.recommended is not None
    assert threshold.recommended.agreement.value == 1.0
    assert "threshold from human labels (n=80)" in report.recommendation.headline
    summary = report.summary()
    assert summary.threshold_source == "labels"
    assert summary.label_accuracy == {"off/m": pytest.approx((80 - missed) / 80)}
    # per tenant: the report's on/off agreement and the log's block rate, side by side in the summary
    assert {row.tenant for row in report.tenants} == {"news", "kids"}
    block_rates = {row.tenant: row.block_rate for row in report.tenant_decisions}
    news = block_rates["news"]
    assert news is not None
    assert news.k == sum(1 for i in range(40) if i % 4 == 0 and 0.5 + i / 80 >= 0.7)
    assert set(summary.tenants) == {"news", "kids"}
    assert summary.tenants["news"].agreement == next(
        r.agreement.value for r in report.tenants if r.tenant == "news"
    )
    assert summary.tenants["news"].block_rate == news.value


def test_the_html_report_shows_both_scores_the_strata_and_the_reviewers_kappa() -> None:
    records, rows = [], []
    for i in range(8):
        blocked = i % 2 == 0
        records += [record(i, "thinking_on", "block" if blocked else "allow", "news"),
                    record(i, "thinking_off", "block" if blocked else "allow", "news", 0.9)]
        decided = decision(i, action="block" if blocked else "allow").model_copy(
            update={"review_reason": "audit", "audit_sample_rate": 0.5})
        rows += [decided, label(decided, "block" if blocked else "allow")]
        if i < 4:  # a second reviewer on half the frames, who disagrees once
            second = label(decided, "allow" if i == 0 else ("block" if blocked else "allow"))
            rows.append(second.model_copy(update={"labelled_by": "bob (reviewer)"}))
    table, policy = records_table(records), ReportPolicy(bootstrap_resamples=100)
    report = build_weekly_report_from(table, "2026-W48", policy, decisions=rows, isolate=False)
    assert report.labels is not None
    assert report.labels.reviewers is not None
    page = render_html(report)

    assert "action alone" in page
    assert "category set alone" in page
    assert "Cohen&#39;s kappa" in page or "Cohen's kappa" in page
    assert f"{report.labels.reviewers.kappa:.2f}" in page
    (stratum,) = report.labels.strata
    assert (stratum.reason, stratum.queued, stratum.labelled) == ("audit", 8, 8)
    assert "<td>audit</td>" in page
