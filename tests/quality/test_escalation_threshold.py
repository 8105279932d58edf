"""The weekly report's threshold section on synthetic weeks whose population figures are known exactly.

Each frame has a latent difficulty: the frames thinking off gets wrong (6 %) are harder by a binormal shift
that gives a chosen AUROC, and the fast verdict's confidence falls with difficulty. So for any threshold
the true share escalated and the true agreement with thinking on are normal-distribution integrals, and
the estimates (from random pairs, or from every pair with inverse-probability weights) must cover them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from scipy.stats import norm

from contracts.records import PairedRecord, VerdictRecord, pair_records
from quality.escalation import escalation_reason, same_verdict, threshold_section, weighted_auroc
from quality.report import ReportPolicy, build_weekly_report, render_html, render_markdown

WEEK_START = datetime(2026, 11, 23, tzinfo=UTC)
CHANGED = 0.06  # share of frames whose verdict thinking off changes
OFFSET = 2.5  # confidence = 1/3 + 2/3·Φ(OFFSET − difficulty): most fast verdicts are sure


def confidence_of(difficulty: np.ndarray) -> np.ndarray:
    return np.asarray(1 / 3 + (2 / 3) * norm.cdf(OFFSET - difficulty), dtype=np.float64)


def difficulty_below(threshold: float) -> float:
    """The difficulty above which a frame's confidence is below ``threshold``."""
    return OFFSET - float(norm.ppf((threshold - 1 / 3) * 1.5))


@dataclass(frozen=True)
class Population:
    """The true figures of the population at a threshold (no review verdict, no forced category)."""

    separation: float

    @property
    def shift(self) -> float:
        return math.sqrt(2) * float(norm.ppf(self.separation))

    def escalated(self, threshold: float) -> float:
        cut = difficulty_below(threshold)
        return (1 - CHANGED) * float(norm.sf(cut)) + CHANGED * float(norm.sf(cut - self.shift))

    def agreement(self, threshold: float) -> float:
        cut = difficulty_below(threshold)
        return 1 - CHANGED * float(norm.cdf(cut - self.shift))


def frame_record(
    index: int, video: int, arm: str, action: str, categories: list[str], **extra: object
) -> VerdictRecord:
    return VerdictRecord.model_validate(
        {
            "frame_sha256": hashlib.sha256(f"frame-{index}".encode()).hexdigest(),
            "video_id": f"video-{video:04d}",
            "tenant": "acme",
            "arm": arm,
            "action": action,
            "flagged": action != "allow",
            "categories": categories,
            "policy_version": 4,
            "prompt_tokens": 1076,
            "cached_tokens": 0,
            "completion_tokens": 3,
            "reasoning_tokens": 0,
            "latency_ms": 400.0,
            "recorded_at": WEEK_START + timedelta(hours=1, seconds=index),
            "source": "shadow",
            "request_id": f"req-{index}-{arm}",
            **extra,
        }
    )


def live_week(
    frames: int,
    separation: float,
    *,
    shadow_share: float = 1.0,
    live_threshold: float | None = None,
    videos: int | None = None,
    seed: int = 5,
) -> list[VerdictRecord]:
    """Records of a week of live traffic: random shadow pairs and, with ``live_threshold``, escalation pairs.

    A frame's pair is recorded when the shadow coin falls (probability ``shadow_share``: random) or when
    its fast confidence is below ``live_threshold`` (always: an escalation).
    """
    rng = np.random.default_rng(seed)
    shift = Population(separation).shift
    changed = rng.random(frames) < CHANGED
    difficulty = rng.normal(0, 1, frames) + np.where(changed, shift, 0.0)
    confidence = confidence_of(difficulty)
    video_of = rng.integers(0, videos or frames // 10, frames)
    records = []
    for i in range(frames):
        truth = "block" if rng.random() < 0.1 else "allow"
        on_categories = ["violence"] if truth == "block" else []
        fast = ("allow", []) if truth == "block" else ("block", ["violence"])
        off_action, off_categories = fast if changed[i] else (truth, on_categories)
        coin = rng.random() < shadow_share
        escalated = live_threshold is not None and confidence[i] < live_threshold
        if not (coin or escalated):
            continue
        probability = 1.0 if escalated else shadow_share
        marks = {
            "selection": "random" if coin else "escalation",
            "selection_probability": probability,
        }
        video = int(video_of[i])
        records.append(frame_record(i, video, "thinking_on", truth, on_categories, **marks))
        records.append(
            frame_record(
                i, video, "thinking_off", off_action, off_categories, confidence=float(confidence[i]), **marks
            )
        )
    return records


def pairs_of(records: list[VerdictRecord]) -> list[PairedRecord]:
    return pair_records(records, "thinking_on", "thinking_off").pairs


def test_the_rule_escalates_review_unsure_forced_categories_and_verdicts_without_confidence() -> None:
    always = {"sexual/minors"}
    assert escalation_reason("review", [], 0.99, 0.8, always) == "review"
    assert escalation_reason("block", ["sexual/minors"], 0.99, 0.8, always) == "category"
    assert escalation_reason("allow", [], 0.79, 0.8, always) == "low_confidence"
    assert escalation_reason("allow", [], None, 0.8, always) == "no_confidence"
    assert escalation_reason("allow", [], 0.8, 0.8, always) is None
    assert escalation_reason("block", ["violence"], 0.95, 0.8, always) is None


def test_verdicts_agree_on_the_action_and_a_block_s_categories() -> None:
    assert same_verdict("block", ["violence"], "block", ["violence"])
    assert not same_verdict("block", ["violence"], "block", ["sexual"])
    assert same_verdict("allow", [], "allow", [])
    assert not same_verdict("allow", [], "review", [])


def test_weighted_auroc_matches_the_rank_statistic_and_counts_ties_half() -> None:
    score = np.array([0.1, 0.4, 0.35, 0.8, 0.4])
    positive = np.array([False, False, True, True, True])
    # positives 0.35, 0.8, 0.4 against negatives 0.1, 0.4: wins 1+0, 1+1, 1+0.5 of 6
    assert weighted_auroc(score, positive, np.ones((1, 5)))[0] == pytest.approx(4.5 / 6)
    doubled = weighted_auroc(score, positive, np.array([[1, 1, 1, 2, 1.0]]))[0]
    assert doubled == pytest.approx((1 + 0 + 2 * 2 + 1.5) / (4 * 2))


@pytest.mark.parametrize("separation", [0.75, 0.85, 0.95])
def test_random_pairs_recover_the_true_escalated_share_agreement_and_auroc(separation: float) -> None:
    truth = Population(separation)
    section = threshold_section(
        pairs_of(live_week(6000, separation, seed=int(separation * 100))),
        thresholds=[0.8, 0.9, 0.95, 0.97],
        resamples=600,
    )
    assert section is not None
    assert section.sample == "random"
    assert section.pairs == 6000
    assert section.disagreement.low <= CHANGED <= section.disagreement.high
    assert section.auroc is not None
    assert section.auroc.low <= separation <= section.auroc.high
    for row in section.rows:
        assert row.escalated.low <= truth.escalated(row.threshold) <= row.escalated.high, row
        assert row.agreement.low <= truth.agreement(row.threshold) <= row.agreement.high, row
    # escalating more never agrees less, and recovers more disagreements
    assert [r.escalated.value for r in section.rows] == sorted(r.escalated.value for r in section.rows)
    recovered = [r.recovered or 0.0 for r in section.rows]
    assert recovered == sorted(recovered)


def test_a_better_separated_model_needs_fewer_escalations_for_the_same_agreement() -> None:
    shares = []
    for separation in (0.75, 0.95):
        section = threshold_section(
            pairs_of(live_week(6000, separation, seed=11)), target=0.975, resamples=300
        )
        assert section is not None
        assert section.recommended is not None
        shares.append(section.recommended.escalated.value)
    assert shares[1] < shares[0] / 2


def test_escalation_pairs_alone_mislead_and_inverse_probability_weights_correct_them() -> None:
    truth = Population(0.85)
    records = live_week(20000, 0.85, shadow_share=0.1, live_threshold=0.9, seed=3)
    pairs = pairs_of(records)
    random_only = threshold_section(pairs, thresholds=[0.9], resamples=400)
    weighted = threshold_section(pairs, sample="ipw", thresholds=[0.9], resamples=400)
    assert random_only is not None
    assert weighted is not None
    assert random_only.escalation_pairs == weighted.escalation_pairs > 0
    assert weighted.pairs > random_only.pairs  # the weighted estimate also uses the escalations
    for section in (random_only, weighted):
        (row,) = section.rows
        assert row.escalated.low <= truth.escalated(0.9) <= row.escalated.high
        assert section.disagreement.low <= CHANGED <= section.disagreement.high
    # the naive reading of every pair, unweighted, sees mostly unsure frames: disagreement far above 6 %
    naive = np.mean(
        [
            not same_verdict(
                p.candidate.action, p.candidate.categories, p.reference.action, p.reference.categories
            )
            for p in pairs
        ]
    )
    assert naive > 2 * CHANGED


def test_the_recommendation_names_a_threshold_the_interval_clears() -> None:
    section = threshold_section(pairs_of(live_week(8000, 0.85, seed=9)), target=0.98, resamples=400)
    assert section is not None
    assert section.recommended is not None
    row = section.recommended
    assert row.agreement.low >= 0.98
    lower = [r for r in section.rows if r.threshold < row.threshold]
    assert all(r.agreement.low < 0.98 for r in lower)
    text = section.recommendation
    assert text.startswith(f"Escalate below {row.threshold:.3g}: {row.escalated.value * 100:.0f} % escalated")
    assert f"[{row.agreement.low * 100:.1f}, {row.agreement.high * 100:.1f}]" in text


def test_a_target_no_threshold_reaches_says_so() -> None:
    section = threshold_section(
        pairs_of(live_week(3000, 0.75, seed=2)), thresholds=[0.5, 0.6], target=0.999, resamples=200
    )
    assert section is not None
    assert section.recommended is None
    assert section.recommendation.startswith("No threshold up to 0.6 reaches 99.9 %")


def test_forced_categories_and_reviews_escalate_at_every_threshold() -> None:
    records = []
    for i, (action, categories) in enumerate([("review", []), ("block", ["sexual/minors"])] * 20):
        records.append(frame_record(i, i, "thinking_on", "allow", []))
        records.append(frame_record(i, i, "thinking_off", action, categories, confidence=0.999))
    section = threshold_section(pairs_of(records), thresholds=[0.5], resamples=100)
    assert section is not None
    (row,) = section.rows
    assert row.escalated.value == 1.0
    assert row.agreement.value == 1.0
    assert section.disagreement.value == 1.0


def test_the_weekly_report_carries_the_threshold_section_from_random_pairs_only() -> None:
    records = live_week(4000, 0.85, shadow_share=0.5, live_threshold=0.9, seed=4)
    report = build_weekly_report(records, "2026-W48", ReportPolicy(bootstrap_resamples=200))
    section = report.escalation
    assert section is not None
    assert section.sample == "random"
    assert section.escalation_pairs > 0
    random_pairs = sum(1 for r in records if r.arm == "thinking_off" and r.selection == "random")
    assert section.pairs == random_pairs
    # the main comparison leaves escalation pairs out too: they are not a random sample
    assert report.comparison is not None
    assert report.comparison.frames == random_pairs
    markdown = render_markdown(report)
    assert "## Escalation threshold" in markdown
    assert section.recommendation in markdown
    assert "Escalation threshold" in render_html(report)


def test_a_week_without_fast_confidences_has_no_threshold_table_but_says_why() -> None:
    records = [r.model_copy(update={"confidence": None}) for r in live_week(300, 0.85, seed=1)]
    report = build_weekly_report(records, "2026-W48", ReportPolicy(bootstrap_resamples=100))
    assert report.escalation is not None
    assert report.escalation.without_confidence == 300
    assert all(row.escalated.value == 1.0 for row in report.escalation.rows)
