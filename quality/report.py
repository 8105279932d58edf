"""The weekly quality report: what turning thinking off costs in verdicts, led by a recommendation.

`build_weekly_report` is plain CPU work over a list of records (call it from a thread in a server);
`render_html`, `render_markdown` and `render_json` turn the result into files an operator reads.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import numpy as np
from jinja2 import Environment, PackageLoader
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sklearn.metrics import cohen_kappa_score

from quality import charts
from quality.records import (
    ARMS,
    Arm,
    PairedRecord,
    VerdictRecord,
    format_iso_week,
    pair_records,
    parse_iso_week,
    week_bounds,
)
from quality.stats import (
    BootstrapInterval,
    PairedFlags,
    Proportion,
    ac1_from_table,
    agreement_from_table,
    classification_scores,
    design_effect,
    flag_rate_difference_from_table,
    flagged_agreement_from_table,
    kappa_from_table,
    mcnemar_exact,
    pabak_from_table,
    safe_agreement_from_table,
    sample_size_for_drop,
    video_bootstrap_cis,
    wilson_interval,
)

__all__ = [
    "ArmCost",
    "CategoryRow",
    "Coefficient",
    "Comparison",
    "Decision",
    "HumanScore",
    "Rate",
    "Recommendation",
    "ReportFiles",
    "ReportPolicy",
    "WeekSummary",
    "WeeklyReport",
    "build_weekly_report",
    "load_previous_summaries",
    "render_html",
    "render_json",
    "render_markdown",
    "write_report",
]

logger = logging.getLogger(__name__)

Decision = Literal["thinking_off_ok", "keep_thinking_on", "inconclusive", "no_data"]
ACTIONS = ("allow", "review", "block")


class ReportPolicy(BaseModel):
    """Thresholds the recommendation is judged against (the thinking policy will carry these)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_agreement: float = Field(default=0.97, gt=0, le=1)
    min_flagged_agreement: float = Field(default=0.90, gt=0, le=1)
    confidence: float = Field(default=0.95, gt=0, lt=1)
    bootstrap_resamples: int = Field(default=2000, ge=100)
    seed: int = 20261123
    detectable_drop: float = Field(default=0.01, gt=0, lt=1)
    detectable_flagged_drop: float = Field(default=0.05, gt=0, lt=1)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    power: float = Field(default=0.80, gt=0, lt=1)
    min_category_flagged: int = Field(default=10, ge=1)  # fewer flagged frames: listed, not judged


# --- report models -----------------------------------------------------------------------------------


class Rate(BaseModel):
    """k of n with the Wilson interval (independent frames) and the video-bootstrap interval.

    `low`/`high` are the union of the two: the conservative interval the recommendation uses.
    """

    k: int
    n: int
    value: float
    wilson_low: float
    wilson_high: float
    bootstrap_low: float | None = None
    bootstrap_high: float | None = None

    @property
    def low(self) -> float:
        return min(self.wilson_low, self.bootstrap_low if self.bootstrap_low is not None else 1.0)

    @property
    def high(self) -> float:
        return max(self.wilson_high, self.bootstrap_high if self.bootstrap_high is not None else 0.0)


class Coefficient(BaseModel):
    """A statistic with its video-bootstrap interval; None where undefined (for example 0/0)."""

    value: float | None
    low: float | None = None
    high: float | None = None


class McNemar(BaseModel):
    reference_only: int
    candidate_only: int
    p_value: float
    direction: str


class Comparison(BaseModel):
    """The reference arm against the candidate arm on the frames both judged."""

    reference: Arm
    candidate: Arm
    frames: int
    videos: int
    agreement: Rate
    flagged_agreement: Rate | None
    safe_agreement: Rate | None
    action_agreement: Rate
    kappa: Coefficient
    pabak: Coefficient
    ac1: Coefficient
    action_kappa: float | None
    mcnemar: McNemar
    reference_flag_rate: float
    candidate_flag_rate: float
    flag_rate_difference: Coefficient
    flagged_table: list[list[int]]  # rows: reference flagged, safe; columns: candidate flagged, safe
    action_table: list[list[int]]  # rows: reference allow, review, block; columns: candidate
    design_effect: float


class CategoryRow(BaseModel):
    category: str
    reference_flagged: int
    candidate_flagged: int
    both_flagged: int
    reference_rate: float
    candidate_rate: float
    flagged_agreement: Rate | None
    judged: bool
    below_threshold: bool


class TenantRow(BaseModel):
    tenant: str
    frames: int
    agreement: Rate
    flagged_agreement: Rate | None


class ArmCost(BaseModel):
    arm: Arm
    frames: int
    cache_hits: int
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    latency_quantiles_ms: list[float]  # 0 %, 1 %, …, 100 %
    ttft_p50_ms: float | None
    mean_prompt_tokens: float
    mean_cached_tokens: float
    mean_completion_tokens: float
    mean_reasoning_tokens: float


class HumanScore(BaseModel):
    arm: Arm
    frames: int
    accuracy: Rate
    precision: Rate | None
    recall: Rate | None


class SampleSizeNeeded(BaseModel):
    baseline: float
    drop: float
    frames_independent: int
    design_effect: float
    frames: int
    flagged_baseline: float | None = None
    flagged_drop: float | None = None
    flagged_frames: int | None = None
    frames_for_flagged: int | None = None


class WeekSummary(BaseModel):
    """One week's headline figures: what the trend chart needs from past reports."""

    week: str
    frames: int
    agreement: float | None = None
    agreement_low: float | None = None
    agreement_high: float | None = None
    flagged_frames: int = 0
    flagged_agreement: float | None = None
    flagged_agreement_low: float | None = None
    flagged_agreement_high: float | None = None
    noise_floor: float | None = None
    noise_floor_low: float | None = None
    noise_floor_high: float | None = None
    decision: Decision = "no_data"


class Recommendation(BaseModel):
    decision: Decision
    title: str
    headline: str
    details: list[str]


class DataNotes(BaseModel):
    records: int
    records_by_arm: dict[str, int]
    records_by_source: dict[str, int]
    policy_versions: list[int]
    tenants: int
    unpaired_reference: int = 0
    unpaired_candidate: int = 0
    duplicates: int = 0
    reused_reruns: int = 0


class WeeklyReport(BaseModel):
    week: str
    week_start: datetime
    week_end: datetime
    generated_at: datetime
    policy: ReportPolicy
    recommendation: Recommendation
    comparison: Comparison | None
    noise_floor: Comparison | None
    # the verdict format as an arm: compact against JSON (thinking off), and JSON thinking off against on
    format_comparisons: list[Comparison] = Field(default_factory=list)
    categories: list[CategoryRow]
    tenants: list[TenantRow]
    costs: list[ArmCost]
    human: list[HumanScore]
    sample_size: SampleSizeNeeded | None
    trend: list[WeekSummary]
    data: DataNotes

    @property
    def last_day(self) -> datetime:
        return self.week_end - timedelta(days=1)

    def summary(self) -> WeekSummary:
        comparison, floor = self.comparison, self.noise_floor
        summary = WeekSummary(
            week=self.week,
            frames=comparison.frames if comparison else 0,
            decision=self.recommendation.decision,
        )
        if comparison is not None:
            summary.agreement = comparison.agreement.value
            summary.agreement_low, summary.agreement_high = (
                comparison.agreement.low,
                comparison.agreement.high,
            )
            if (flagged := comparison.flagged_agreement) is not None:
                summary.flagged_frames = flagged.n
                summary.flagged_agreement = flagged.value
                summary.flagged_agreement_low, summary.flagged_agreement_high = flagged.low, flagged.high
        if floor is not None:
            summary.noise_floor = floor.agreement.value
            summary.noise_floor_low, summary.noise_floor_high = floor.agreement.low, floor.agreement.high
        return summary


# --- building ----------------------------------------------------------------------------------------


def _rate(k: int, n: int, bootstrap: BootstrapInterval | None, confidence: float) -> Rate:
    wilson = wilson_interval(k, n, confidence)
    boot_ok = bootstrap is not None and math.isfinite(bootstrap.low) and math.isfinite(bootstrap.high)
    return Rate(
        k=k,
        n=n,
        value=wilson.value,
        wilson_low=wilson.low,
        wilson_high=wilson.high,
        bootstrap_low=bootstrap.low if boot_ok and bootstrap else None,
        bootstrap_high=bootstrap.high if boot_ok and bootstrap else None,
    )


def _coefficient(interval: BootstrapInterval) -> Coefficient:
    def finite(value: float) -> float | None:
        return value if math.isfinite(value) else None

    return Coefficient(value=finite(interval.estimate), low=finite(interval.low), high=finite(interval.high))


_STATISTICS = {
    "agreement": agreement_from_table,
    "flagged": flagged_agreement_from_table,
    "safe": safe_agreement_from_table,
    "kappa": kappa_from_table,
    "pabak": pabak_from_table,
    "ac1": ac1_from_table,
    "difference": flag_rate_difference_from_table,
}


def _flags(pairs: Sequence[PairedRecord], category: str | None = None) -> PairedFlags:
    if category is None:
        reference = [p.reference.flagged for p in pairs]
        candidate = [p.candidate.flagged for p in pairs]
    else:
        reference = [category in p.reference.categories for p in pairs]
        candidate = [category in p.candidate.categories for p in pairs]
    return PairedFlags.from_sequences(reference, candidate, [p.video_id for p in pairs])


def _compare(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> Comparison:
    flags = _flags(pairs)
    table = flags.table()
    a, b, c, d = (
        int(v) for v in (table.both_flagged, table.reference_only, table.candidate_only, table.both_safe)
    )
    boot = video_bootstrap_cis(flags, _STATISTICS, policy.bootstrap_resamples, policy.seed, policy.confidence)
    n = len(flags)
    agreement = _rate(a + d, n, boot["agreement"], policy.confidence)
    ref_actions = [p.reference.action for p in pairs]
    cand_actions = [p.candidate.action for p in pairs]
    action_table = [
        [
            sum(1 for r, c_ in zip(ref_actions, cand_actions, strict=True) if r == row and c_ == col)
            for col in ACTIONS
        ]
        for row in ACTIONS
    ]
    action_same = sum(action_table[i][i] for i in range(len(ACTIONS)))
    action_kappa: float | None = None
    if len(set(ref_actions) | set(cand_actions)) > 1:
        value = float(cohen_kappa_score(ref_actions, cand_actions, labels=list(ACTIONS)))
        action_kappa = value if math.isfinite(value) else None
    test = mcnemar_exact(flags.reference, flags.candidate)
    return Comparison(
        reference=pairs[0].reference.arm,
        candidate=pairs[0].candidate.arm,
        frames=n,
        videos=flags.n_videos,
        agreement=agreement,
        flagged_agreement=_rate(a, a + b, boot["flagged"], policy.confidence) if a + b else None,
        safe_agreement=_rate(d, c + d, boot["safe"], policy.confidence) if c + d else None,
        action_agreement=_rate(action_same, n, None, policy.confidence),
        kappa=_coefficient(boot["kappa"]),
        pabak=_coefficient(boot["pabak"]),
        ac1=_coefficient(boot["ac1"]),
        action_kappa=action_kappa,
        mcnemar=McNemar(
            reference_only=test.reference_only,
            candidate_only=test.candidate_only,
            p_value=test.p_value,
            direction=test.direction,
        ),
        reference_flag_rate=(a + b) / n,
        candidate_flag_rate=(a + c) / n,
        flag_rate_difference=_coefficient(boot["difference"]),
        flagged_table=[[a, b], [c, d]],
        action_table=action_table,
        design_effect=design_effect(boot["agreement"], wilson_interval(a + d, n, policy.confidence)),
    )


def _categories(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> list[CategoryRow]:
    names = Counter(c for p in pairs for c in {*p.reference.categories, *p.candidate.categories})
    rows = []
    for name in names:
        flags = _flags(pairs, name)
        table = flags.table()
        both, ref_only, cand_only = (
            int(table.both_flagged),
            int(table.reference_only),
            int(table.candidate_only),
        )
        flagged: Rate | None = None
        if both + ref_only:
            boot = video_bootstrap_cis(
                flags,
                {"flagged": flagged_agreement_from_table},
                policy.bootstrap_resamples,
                policy.seed,
                policy.confidence,
            )
            flagged = _rate(both, both + ref_only, boot["flagged"], policy.confidence)
        judged = both + ref_only >= policy.min_category_flagged
        rows.append(
            CategoryRow(
                category=name,
                reference_flagged=both + ref_only,
                candidate_flagged=both + cand_only,
                both_flagged=both,
                reference_rate=(both + ref_only) / len(flags),
                candidate_rate=(both + cand_only) / len(flags),
                flagged_agreement=flagged,
                judged=judged,
                below_threshold=judged
                and flagged is not None
                and flagged.value < policy.min_flagged_agreement,
            )
        )
    rows.sort(key=lambda row: (-row.reference_flagged, row.category))
    return rows


def _tenants(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> list[TenantRow]:
    by_tenant: dict[str, list[PairedRecord]] = {}
    for pair in pairs:
        by_tenant.setdefault(pair.tenant, []).append(pair)
    rows = []
    for tenant, group in sorted(by_tenant.items(), key=lambda item: -len(item[1])):
        flags = _flags(group)
        table = flags.table()
        a, b, d = int(table.both_flagged), int(table.reference_only), int(table.both_safe)
        boot = video_bootstrap_cis(
            flags,
            {"agreement": agreement_from_table, "flagged": flagged_agreement_from_table},
            policy.bootstrap_resamples,
            policy.seed,
            policy.confidence,
        )
        rows.append(
            TenantRow(
                tenant=tenant,
                frames=len(group),
                agreement=_rate(a + d, len(group), boot["agreement"], policy.confidence),
                flagged_agreement=_rate(a, a + b, boot["flagged"], policy.confidence) if a + b else None,
            )
        )
    return rows


def _costs(records: Sequence[VerdictRecord]) -> list[ArmCost]:
    costs = []
    for arm in ARMS:
        # Cache hits cost nothing and would make an arm look faster than the engine is.
        fresh = [r for r in records if r.arm == arm and not r.reused]
        if not fresh:
            continue
        latency = np.asarray([r.latency_ms for r in fresh])
        ttft = [r.ttft_ms for r in fresh if r.ttft_ms is not None]
        costs.append(
            ArmCost(
                arm=arm,
                frames=len(fresh),
                cache_hits=sum(1 for r in records if r.arm == arm and r.reused),
                latency_p50_ms=float(np.quantile(latency, 0.5)),
                latency_p90_ms=float(np.quantile(latency, 0.9)),
                latency_p99_ms=float(np.quantile(latency, 0.99)),
                latency_quantiles_ms=[
                    round(float(v), 1) for v in np.quantile(latency, np.linspace(0, 1, 101))
                ],
                ttft_p50_ms=float(np.median(ttft)) if ttft else None,
                mean_prompt_tokens=float(np.mean([r.prompt_tokens for r in fresh])),
                mean_cached_tokens=float(np.mean([r.cached_tokens for r in fresh])),
                mean_completion_tokens=float(np.mean([r.completion_tokens for r in fresh])),
                mean_reasoning_tokens=float(np.mean([r.reasoning_tokens for r in fresh])),
            )
        )
    return costs


def _wilson_rate(proportion: Proportion) -> Rate:
    return Rate(
        k=proportion.k,
        n=proportion.n,
        value=proportion.value,
        wilson_low=proportion.low,
        wilson_high=proportion.high,
    )


def _human(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> list[HumanScore]:
    labelled = [p for p in pairs if p.human_label is not None]
    if not labelled:
        return []
    truth = [p.human_label.flagged for p in labelled if p.human_label is not None]
    scores = []
    for arm, predicted in (
        (labelled[0].reference.arm, [p.reference.flagged for p in labelled]),
        (labelled[0].candidate.arm, [p.candidate.flagged for p in labelled]),
    ):
        result = classification_scores(truth, predicted, policy.confidence)
        scores.append(
            HumanScore(
                arm=arm,
                frames=len(labelled),
                accuracy=_wilson_rate(result.accuracy),
                precision=_wilson_rate(result.precision) if result.precision else None,
                recall=_wilson_rate(result.recall) if result.recall else None,
            )
        )
    return scores


def _sample_size(comparison: Comparison, policy: ReportPolicy) -> SampleSizeNeeded | None:
    baseline = min(max(comparison.agreement.value, policy.min_agreement), 0.999)
    if policy.detectable_drop >= baseline:
        return None
    size = sample_size_for_drop(baseline, policy.detectable_drop, policy.alpha, policy.power)
    needed = SampleSizeNeeded(
        baseline=baseline,
        drop=policy.detectable_drop,
        frames_independent=size.frames,
        design_effect=comparison.design_effect,
        frames=math.ceil(size.frames * comparison.design_effect),
    )
    flagged = comparison.flagged_agreement
    if flagged is not None and comparison.reference_flag_rate > 0:
        flagged_baseline = min(max(flagged.value, policy.min_flagged_agreement), 0.999)
        if policy.detectable_flagged_drop < flagged_baseline:
            flagged_size = sample_size_for_drop(
                flagged_baseline, policy.detectable_flagged_drop, policy.alpha, policy.power
            )
            needed.flagged_baseline = flagged_baseline
            needed.flagged_drop = policy.detectable_flagged_drop
            needed.flagged_frames = flagged_size.frames
            needed.frames_for_flagged = math.ceil(flagged_size.frames / comparison.reference_flag_rate)
    return needed


# --- the recommendation -------------------------------------------------------------------------------


def pct(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * 100:.{digits}f} %"


def interval(low: float | None, high: float | None, digits: int = 1) -> str:
    if low is None or high is None:
        return ""
    return f"[{low * 100:.{digits}f}, {high * 100:.{digits}f}]"


def count(value: int) -> str:
    return f"{value:,}"


def _rate_text(rate: Rate) -> str:
    return f"{pct(rate.value)} {interval(rate.low, rate.high)}"


def _recommend(report: WeeklyReport) -> Recommendation:
    policy, comparison = report.policy, report.comparison
    records, arms = report.data.records, report.data.records_by_arm
    if comparison is None:
        if records == 0:
            headline = (
                f"No quality records for {report.week}: nothing to judge. Turn on shadow sampling "
                "or run `modgate quality run DATASET --arms thinking_on,thinking_off`."
            )
        else:
            present = ", ".join(f"{arm.replace('_', ' ')} ({n:,})" for arm, n in arms.items() if n)
            headline = (
                f"No paired verdicts for {report.week}: records came only from {present}, so "
                "nothing compares thinking off with thinking on. Keep thinking on; run both arms "
                "(`--arms thinking_on,thinking_off`) on the same frames."
            )
        return Recommendation(
            decision="no_data", title="No comparison this week", headline=headline, details=[]
        )

    agreement, flagged = comparison.agreement, comparison.flagged_agreement
    min_all, min_flagged = pct(policy.min_agreement, 0), pct(policy.min_flagged_agreement, 0)
    evidence = (
        f"Thinking off agrees {_rate_text(agreement)} with thinking on "
        f"over {count(comparison.frames)} frames "
        f"from {count(comparison.videos)} videos"
    )
    evidence += (
        f", and {_rate_text(flagged)} on the {count(flagged.n)} frames thinking on flagged"
        if flagged
        else "; thinking on flagged none of them"
    )
    agreement_ok = agreement.low >= policy.min_agreement
    flagged_ok = flagged is not None and flagged.low >= policy.min_flagged_agreement
    agreement_below = agreement.value < policy.min_agreement
    flagged_below = flagged is not None and flagged.value < policy.min_flagged_agreement

    decision: Decision
    if agreement_below or flagged_below:
        decision, title = "keep_thinking_on", "Keep thinking on"
        if agreement_below and flagged_below:
            verdict = f"both below the policy minimums ({min_all}, {min_flagged} on flagged)"
        elif agreement_below:
            verdict = f"below the {min_all} policy minimum"
        else:
            verdict = f"the flagged figure is below the {min_flagged} policy minimum"
        headline = f"{evidence}: {verdict}. Keep thinking on."
    elif agreement_ok and flagged_ok:
        decision, title = "thinking_off_ok", "Thinking off meets policy"
        headline = (
            f"{evidence}: both intervals clear the policy minimums ({min_all}, {min_flagged} on flagged). "
            "Thinking can be turned off where this policy applies."
        )
    else:
        decision, title = "inconclusive", "Not enough evidence yet"
        short = []
        if not agreement_ok:
            short.append(f"the interval still reaches below the {min_all} minimum")
        if not flagged_ok:
            short.append(
                "too few flagged frames to judge"
                if flagged is None
                else f"the flagged interval still reaches below the {min_flagged} minimum"
            )
        headline = f"{evidence}, but {' and '.join(short)}. Keep thinking on"
        if report.sample_size is not None:
            needed = max(report.sample_size.frames, report.sample_size.frames_for_flagged or 0)
            headline += f" until about {count(needed)} paired frames settle it"
        headline += "."

    return Recommendation(decision=decision, title=title, headline=headline, details=_details(report))


def _details(report: WeeklyReport) -> list[str]:
    comparison, policy = report.comparison, report.policy
    assert comparison is not None
    details = []
    test, diff = comparison.mcnemar, comparison.flag_rate_difference
    shift = (
        f"flag rate {pct(comparison.reference_flag_rate, 2)} → {pct(comparison.candidate_flag_rate, 2)}, "
        f"difference {_points(diff.value)} {_points_interval(diff.low, diff.high)} by video bootstrap"
    )
    if test.reference_only + test.candidate_only == 0:
        details.append(f"Both arms flagged exactly the same frames ({shift}).")
    elif test.p_value < policy.alpha:
        more_less = "more" if test.candidate_only > test.reference_only else "less"
        details.append(
            f"Thinking off flags {more_less}: {count(test.reference_only)} frames flagged only with "
            f"thinking on, {count(test.candidate_only)} only with thinking off "
            f"(exact McNemar p = {test.p_value:.3g}; {shift})."
        )
    else:
        details.append(
            f"No significant shift in what gets flagged: {count(test.reference_only)} frames flagged "
            f"only with thinking on, {count(test.candidate_only)} only with thinking off "
            f"(exact McNemar p = {test.p_value:.2g}; {shift})."
        )
    failing = [row for row in report.categories if row.below_threshold and row.flagged_agreement]
    if failing:
        listed = "; ".join(
            f"{row.category} {_rate_text(row.flagged_agreement)} of {count(row.flagged_agreement.n)}"
            for row in failing
            if row.flagged_agreement
        )
        details.append(f"Keep thinking on for categories below the flagged minimum: {listed}.")
    elif any(row.judged for row in report.categories):
        details.append(
            f"Every category with at least {policy.min_category_flagged} flagged frames meets the "
            f"{pct(policy.min_flagged_agreement, 0)} flagged minimum."
        )
    thin = [row for row in report.categories if not row.judged]
    if thin:
        details.append(
            "Too few flagged frames to judge: "
            + ", ".join(f"{row.category} ({row.reference_flagged})" for row in thin[:8])
            + "."
        )
    floor = report.noise_floor
    if floor is not None:
        excess = (1 - comparison.agreement.value) - (1 - floor.agreement.value)
        details.append(
            f"Noise floor: thinking on agrees with its own re-run {_rate_text(floor.agreement)} over "
            f"{count(floor.frames)} frames, so {max(excess, 0.0) * 100:.1f} of thinking off's "
            f"{(1 - comparison.agreement.value) * 100:.1f} points of disagreement are beyond "
            "run-to-run noise."
        )
    else:
        details.append(
            "No thinking-on re-runs this week, so no noise floor: add `thinking_on_rerun` to `--arms`."
        )
    costs = {cost.arm: cost for cost in report.costs}
    on, off = costs.get("thinking_on"), costs.get("thinking_off")
    if on is not None and off is not None:
        details.append(
            f"What thinking off saves: median latency {on.latency_p50_ms / 1000:.2f} s → "
            f"{off.latency_p50_ms / 1000:.2f} s, completion tokens {on.mean_completion_tokens:.0f} → "
            f"{off.mean_completion_tokens:.0f} per frame."
        )
    for score in report.human:
        if score.recall is not None:
            details.append(
                f"Against {count(score.frames)} human labels, {score.arm.replace('_', ' ')}: recall "
                f"{_rate_text(score.recall)}, accuracy {_rate_text(score.accuracy)}."
            )
    if report.sample_size is not None:
        size = report.sample_size
        text = (
            f"Detecting a {size.drop * 100:g}-point drop from {pct(size.baseline)} "
            f"needs {count(size.frames)} "
            f"frames a week (one-sided α {policy.alpha:g}, power {pct(policy.power, 0)}"
        )
        text += f", design effect {size.design_effect:.2f})" if size.design_effect > 1.005 else ")"
        if size.flagged_frames is not None and size.frames_for_flagged is not None:
            text += (
                f"; a {(size.flagged_drop or 0) * 100:g}-point drop on flagged frames needs "
                f"{count(size.flagged_frames)} flagged, about {count(size.frames_for_flagged)} frames"
            )
        details.append(text + f". This week had {count(comparison.frames)}.")
    notes = report.data
    if notes.unpaired_reference or notes.unpaired_candidate:
        details.append(
            f"Not paired: {count(notes.unpaired_reference)} thinking-on and "
            f"{count(notes.unpaired_candidate)} "
            "thinking-off records had no partner on the same frame and policy version."
        )
    return details


def _points(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 100:+.2f} points"


def _points_interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return ""
    return f"[{low * 100:+.2f}, {high * 100:+.2f}]"


FORMAT_COMPARISONS: tuple[tuple[Arm, Arm], ...] = (
    ("thinking_off_json", "thinking_off"),  # does the compact form change what thinking off says?
    ("thinking_on", "thinking_off_json"),  # the JSON form's own agreement with thinking on
    ("thinking_on_json", "thinking_on"),  # the format with thinking on
)


def build_weekly_report(
    records: Iterable[VerdictRecord],
    week: str,
    policy: ReportPolicy | None = None,
    previous: Sequence[WeekSummary] = (),
    generated_at: datetime | None = None,
) -> WeeklyReport:
    """Everything the report says about one ISO week (`2026-W48`). CPU-bound: run it in a thread."""
    policy = policy or ReportPolicy()
    year, number = parse_iso_week(week)
    start, end = week_bounds(year, number)
    week_records = [r for r in records if start <= r.recorded_at < end]
    pairing = pair_records(week_records, "thinking_on", "thinking_off")
    rerun = pair_records(week_records, "thinking_on", "thinking_on_rerun", skip_reused_candidates=True)
    arms = Counter(r.arm for r in week_records)
    comparison = _compare(pairing.pairs, policy) if pairing.pairs else None
    report = WeeklyReport(
        week=format_iso_week(year, number),
        week_start=start,
        week_end=end,
        generated_at=generated_at or datetime.now(UTC),
        policy=policy,
        recommendation=Recommendation(decision="no_data", title="", headline="", details=[]),
        comparison=comparison,
        noise_floor=_compare(rerun.pairs, policy) if rerun.pairs else None,
        format_comparisons=[
            _compare(pairs, policy)
            for reference, candidate in FORMAT_COMPARISONS
            if (pairs := pair_records(week_records, reference, candidate).pairs)
        ],
        categories=_categories(pairing.pairs, policy) if pairing.pairs else [],
        tenants=_tenants(pairing.pairs, policy) if pairing.pairs else [],
        costs=_costs(week_records),
        human=_human(pairing.pairs, policy),
        sample_size=_sample_size(comparison, policy) if comparison else None,
        trend=[],
        data=DataNotes(
            records=len(week_records),
            records_by_arm={arm: arms.get(arm, 0) for arm in ARMS},
            records_by_source={str(k): v for k, v in Counter(r.source for r in week_records).items()},
            policy_versions=sorted({r.policy_version for r in week_records}),
            tenants=len({r.tenant for r in week_records}),
            unpaired_reference=pairing.unpaired_reference,
            unpaired_candidate=pairing.unpaired_candidate,
            duplicates=pairing.duplicates,
            reused_reruns=rerun.reused_candidates,
        ),
    )
    report.recommendation = _recommend(report)
    earlier = sorted((s for s in previous if s.week < report.week), key=lambda s: s.week)
    report.trend = [*earlier, report.summary()]
    return report


def load_previous_summaries(directory: Path, week: str, limit: int = 12) -> list[WeekSummary]:
    """Summaries of up to `limit` earlier weeks from reports already written in `directory`."""
    summaries = []
    for path in sorted(directory.glob("quality-*.json")):
        label = path.stem.removeprefix("quality-")
        if label >= week:
            continue
        try:
            summaries.append(WeeklyReport.model_validate_json(path.read_text(encoding="utf-8")).summary())
        except (ValidationError, ValueError, OSError):
            logger.warning("skipping unreadable earlier report %s", path)
    return summaries[-limit:]


# --- rendering ---------------------------------------------------------------------------------------


def render_json(report: WeeklyReport) -> str:
    return report.model_dump_json(indent=2)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("quality", "templates"), autoescape=True, trim_blocks=True, lstrip_blocks=True
    )
    env.filters.update(
        pct=pct, interval=interval, count=count, points=_points, points_interval=_points_interval
    )
    return env


def render_html(report: WeeklyReport) -> str:
    """One self-contained HTML file: inline CSS, charts as base64 PNGs, no scripts, no network."""
    images: dict[str, str] = {}
    if report.comparison is not None:
        images["confusion"] = charts.png_data_uri(
            charts.confusion_chart(report.comparison, report.noise_floor)
        )
    if report.categories:
        images["categories"] = charts.png_data_uri(charts.category_chart(report.categories, report.policy))
    if any(s.agreement is not None for s in report.trend):
        images["trend"] = charts.png_data_uri(charts.trend_chart(report.trend, report.policy))
    if report.costs:
        images["costs"] = charts.png_data_uri(charts.cost_chart(report.costs))
    template = _environment().get_template("weekly_report.html.jinja")
    return template.render(report=report, images=images, arm_label=charts.ARM_LABELS)


def _md_rate(rate: Rate | None) -> str:
    return "–" if rate is None else f"{pct(rate.value)} {interval(rate.low, rate.high)} (n={rate.n:,})"


def _md_coefficient(c: Coefficient) -> str:
    value = "–" if c.value is None else f"{c.value:.3f}"
    if c.low is None or c.high is None:
        return value
    return f"{value} [{c.low:.3f}, {c.high:.3f}]"


def render_markdown(report: WeeklyReport) -> str:
    rec = report.recommendation
    lines = [
        f"# Thinking-off quality, {report.week}",
        "",
        f"_{report.week_start:%d %b %Y} – {report.last_day:%d %b %Y} (UTC), generated "
        f"{report.generated_at:%Y-%m-%d %H:%M} UTC_",
        "",
        f"## {rec.title}",
        "",
        rec.headline,
        "",
    ]
    lines += [f"- {detail}" for detail in rec.details]
    comparison = report.comparison
    if comparison is not None:
        lines += [
            "",
            "## Agreement, thinking on vs thinking off",
            "",
            "| measure | value [95 % interval] |",
            "| --- | --- |",
            f"| raw agreement | {_md_rate(comparison.agreement)} |",
            f"| on frames thinking on flagged | {_md_rate(comparison.flagged_agreement)} |",
            f"| on frames thinking on left safe | {_md_rate(comparison.safe_agreement)} |",
            f"| same action (allow/review/block) | {_md_rate(comparison.action_agreement)} |",
            f"| Cohen's kappa | {_md_coefficient(comparison.kappa)} |",
            f"| PABAK | {_md_coefficient(comparison.pabak)} |",
            f"| Gwet's AC1 | {_md_coefficient(comparison.ac1)} |",
            f"| flagged only with thinking on / off | {comparison.mcnemar.reference_only:,} / "
            f"{comparison.mcnemar.candidate_only:,} (exact McNemar p = {comparison.mcnemar.p_value:.3g}) |",
            "",
            "Intervals are the union of the Wilson interval (frames independent) and a percentile "
            "bootstrap over whole videos (frames of one video are correlated).",
        ]
    if report.noise_floor is not None:
        lines += [
            "",
            f"Noise floor (thinking on vs its re-run): {_md_rate(report.noise_floor.agreement)}, "
            f"on flagged {_md_rate(report.noise_floor.flagged_agreement)}.",
        ]
    if report.format_comparisons:
        lines += [
            "",
            "## Verdict format",
            "",
            "| reference | candidate | frames | agreement | on flagged | action agreement | kappa |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {c.reference} | {c.candidate} | {c.frames:,} | {_md_rate(c.agreement)} | "
            f"{_md_rate(c.flagged_agreement)} | {_md_rate(c.action_agreement)} | {_md_coefficient(c.kappa)} |"
            for c in report.format_comparisons
        ]
    if report.categories:
        lines += [
            "",
            "## By category",
            "",
            "| category | flagged (on / off) | agreement on flagged | verdict |",
            "| --- | --- | --- | --- |",
        ]
        for row in report.categories:
            verdict = (
                "too few to judge" if not row.judged else ("below minimum" if row.below_threshold else "ok")
            )
            lines.append(
                f"| {row.category} | {row.reference_flagged:,} / {row.candidate_flagged:,} | "
                f"{_md_rate(row.flagged_agreement)} | {verdict} |"
            )
    if report.tenants:
        lines += [
            "",
            "## By tenant",
            "",
            "| tenant | frames | agreement | on flagged |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {row.tenant} | {row.frames:,} | {_md_rate(row.agreement)} "
            f"| {_md_rate(row.flagged_agreement)} |"
            for row in report.tenants
        ]
    if report.human:
        lines += [
            "",
            "## Against human labels",
            "",
            "| arm | frames | accuracy | precision | recall |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {s.arm} | {s.frames:,} | {_md_rate(s.accuracy)} | {_md_rate(s.precision)} | "
            f"{_md_rate(s.recall)} |"
            for s in report.human
        ]
    if report.costs:
        lines += [
            "",
            "## Cost per arm",
            "",
            "| arm | frames | latency p50 / p90 / p99 | TTFT p50 | prompt (cached) "
            "| completion (reasoning) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for cost in report.costs:
            ttft = "–" if cost.ttft_p50_ms is None else f"{cost.ttft_p50_ms:.0f} ms"
            lines.append(
                f"| {cost.arm} | {cost.frames:,} | {cost.latency_p50_ms / 1000:.2f} / "
                f"{cost.latency_p90_ms / 1000:.2f}"
                f" / {cost.latency_p99_ms / 1000:.2f} s | {ttft} | {cost.mean_prompt_tokens:.0f} "
                f"({cost.mean_cached_tokens:.0f}) | {cost.mean_completion_tokens:.0f} "
                f"({cost.mean_reasoning_tokens:.0f}) |"
            )
    if len(report.trend) > 1:
        lines += [
            "",
            "## Trend",
            "",
            "| week | frames | agreement | on flagged | noise floor | decision |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {s.week} | {s.frames:,} | {pct(s.agreement)} | {pct(s.flagged_agreement)} | "
            f"{pct(s.noise_floor)} | {s.decision} |"
            for s in report.trend
        ]
    data = report.data
    lines += [
        "",
        "## Data",
        "",
        f"{data.records:,} records: "
        + ", ".join(f"{arm} {n:,}" for arm, n in data.records_by_arm.items())
        + "; sources "
        + (", ".join(f"{source} {n:,}" for source, n in data.records_by_source.items()) or "none")
        + "; policy versions "
        + (", ".join(str(v) for v in data.policy_versions) or "none")
        + f"; {data.duplicates:,} repeated verdicts "
        "ignored (first per frame and arm kept).",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path
    json: Path


def write_report(report: WeeklyReport, directory: Path) -> ReportFiles:
    """`quality-2026-W48.html`, `.md` and `.json` in `directory` (the JSON feeds later trends)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"quality-{report.week}"
    files = ReportFiles(
        html=stem.with_suffix(".html"), markdown=stem.with_suffix(".md"), json=stem.with_suffix(".json")
    )
    for path, text in (
        (files.html, render_html(report)),
        (files.markdown, render_markdown(report)),
        (files.json, render_json(report)),
    ):
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)  # readers never see half a report
    return files
