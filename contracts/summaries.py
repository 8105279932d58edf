"""The weekly report's models: what the report says, as values, with no numbers crunched here.

A light module (pydantic and the record vocabulary only: no numpy, scikit-learn or matplotlib), so that
the charts, the renderers and the gateway's console read a report through the very models that wrote it.
Computed by :mod:`quality.sections`, :mod:`quality.recommendation` and :mod:`quality.escalation`;
assembled by :func:`quality.report.build_weekly_report`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.records import Arm

__all__ = [
    "ENGINE_NAMES",
    "ArmCost",
    "CategoryRow",
    "Coefficient",
    "Comparison",
    "DataNotes",
    "Decision",
    "EngineComparison",
    "EngineDecision",
    "EngineKind",
    "EngineSection",
    "EscalationSample",
    "Estimate",
    "HumanScore",
    "LabelAccuracy",
    "LabelSection",
    "LabelThreshold",
    "McNemar",
    "Rate",
    "Recommendation",
    "ReportPolicy",
    "SampleSizeNeeded",
    "TenantDecisionRow",
    "TenantRow",
    "TenantWeek",
    "ThresholdRow",
    "ThresholdSection",
    "ThresholdSource",
    "WeekSummary",
    "WeeklyReport",
]

Decision = Literal["thinking_off_ok", "keep_thinking_on", "inconclusive", "no_data"]
# which pairs estimate the escalation threshold: the random ones, or all weighted (quality.escalation)
EscalationSample = Literal["random", "ipw"]
# which figure chose the escalation threshold: human labels (enough of them), or agreement with thinking on
ThresholdSource = Literal["labels", "agreement"]


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
    # the escalation threshold section: the agreement to reach, the sample it is estimated from, and the
    # categories the thinking policy escalates whatever the confidence
    escalation_target: float = Field(default=0.99, gt=0, le=1)
    # labelled frames (with both thinking verdicts) the escalation threshold needs to be chosen from labels
    min_threshold_labels: int = Field(default=200, ge=1)
    escalation_sample: EscalationSample = "random"
    always_escalate: tuple[str, ...] = ("sexual/minors",)


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
    # judged, not below, but its interval still reaches below the flagged minimum: not yet settled, as the
    # overall figure in that state is (the headline's "not enough evidence yet")
    unsettled: bool = False


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


class TenantWeek(BaseModel):
    """A tenant's week in the JSON summary: thinking on/off agreement and the share of decisions blocked."""

    agreement: float | None = None
    block_rate: float | None = None


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
    # against human labels (the decision log's): weighted accuracy per arm, and where the threshold came from
    label_accuracy: dict[str, float] = Field(default_factory=dict)
    threshold_source: ThresholdSource | None = None
    tenants: dict[str, TenantWeek] = Field(default_factory=dict)


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


# --- the escalation threshold section (computed by quality.escalation) ------------------------------


class Estimate(BaseModel):
    """A share with its interval (the union of the video bootstrap and Wilson on the effective n)."""

    value: float
    low: float
    high: float


class ThresholdRow(BaseModel):
    """One threshold: the share of frames it escalates and how often the answer agrees with thinking on."""

    threshold: float
    escalated: Estimate
    agreement: Estimate
    recovered: float | None  # share of thinking off's disagreements that this threshold re-asks


class ThresholdSection(BaseModel):
    """The weekly report's threshold section."""

    sample: EscalationSample
    pairs: int
    videos: int
    effective_pairs: float
    escalation_pairs: int  # pairs chosen because they escalated (used only with inverse-probability weights)
    without_confidence: int  # fast verdicts with no confidence: they always escalate
    always_escalate: list[str]
    target_agreement: float
    disagreement: Estimate  # thinking off alone against thinking on
    auroc: Estimate | None  # low confidence against disagreement; None when one class is missing
    rows: list[ThresholdRow]
    recommended: ThresholdRow | None
    recommendation: str


EngineDecision = Literal["switch_ok", "keep_reference", "inconclusive"]


class EngineKind(StrEnum):
    """The kinds of engine a verdict record names (`VerdictRecord.engine`); the command line's choices."""

    vllm = "vllm"
    llamacpp = "llamacpp"


# each kind as sentences name it
ENGINE_NAMES: dict[str, str] = {EngineKind.vllm: "vLLM", EngineKind.llamacpp: "llama.cpp"}


class EngineComparison(BaseModel):
    """One arm judged by both engines: the reference engine's verdicts against the other's."""

    arm: Arm
    comparison: Comparison
    candidate_cost: ArmCost | None = None  # the other engine's latency and tokens on this arm
    # agreement on flagged frames per category, judged as the thinking comparison's categories are
    categories: list[CategoryRow] = Field(default_factory=list)


class EngineSection(BaseModel):
    """The engine as an arm: the other engine against the reference on the frames both judged."""

    reference_engine: str
    candidate_engine: str
    comparisons: list[EngineComparison]
    decision: EngineDecision
    headline: str


# --- against human labels, from the decision log (computed by quality.labels) -------------------------



class LabelAccuracy(BaseModel):
    """One arm's (and engine's) decisions against people's labels: the weighted share a person agreed with.

    Each label weighs what it stands for: an audit sample at rate r, 1/r confident decisions; an item queued
    for a ``review`` verdict or a low confidence, itself (all of those are queued). The interval is Wilson's
    on the weighted share with Kish's effective number of labels, (sum w)^2 / sum w^2."""

    arm: str  # off, on, escalate: the thinking mode the policy chose for the frame
    engine: str  # the engine's model
    category: str | None = None  # None: every label; else the labels where the model or the person named it
    labels: int
    effective_labels: float
    accuracy: Estimate


class LabelThreshold(BaseModel):
    """Where the escalation threshold comes from, and the threshold human labels choose."""

    source: ThresholdSource
    labels: int  # labelled frames with both a thinking-off and a thinking-on verdict this week
    min_labels: int
    budget: float | None  # the largest share escalated allowed: the agreement-chosen threshold's
    rows: list[ThresholdRow]  # per threshold: share escalated and accuracy of the escalated answer
    recommended: ThresholdRow | None
    note: str  # "threshold from human labels (n=…)" or "from thinking-on agreement …"


class LabelSection(BaseModel):
    """The week's decisions against the people who labelled them (docs/quality.md, "Against human labels")."""

    labels: int
    arms: list[LabelAccuracy]
    categories: list[LabelAccuracy]
    threshold: LabelThreshold


class TenantDecisionRow(BaseModel):
    """A tenant's decisions this week (the decision log): the share blocked, with its Wilson interval."""

    tenant: str
    decisions: int
    block_rate: Rate | None
    review_share: float | None
    labelled: int
    label_agreement: float | None


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
    escalation: ThresholdSection | None = None  # None: no pair had a fast verdict to judge
    engines: EngineSection | None = None  # None: one engine judged the whole week
    labels: LabelSection | None = None  # None: no decision log was read, or it held no label of the week
    tenant_decisions: list[TenantDecisionRow] = Field(default_factory=list)  # the decision log's, per tenant

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
        if self.labels is not None:
            summary.label_accuracy = {
                f"{row.arm}/{row.engine}": row.accuracy.value for row in self.labels.arms
            }
            summary.threshold_source = self.labels.threshold.source
        tenants: dict[str, TenantWeek] = {}
        for row in self.tenants:
            tenants.setdefault(row.tenant, TenantWeek()).agreement = row.agreement.value
        for figures in self.tenant_decisions:
            tenants.setdefault(figures.tenant, TenantWeek()).block_rate = (
                figures.block_rate.value if figures.block_rate else None
            )
        summary.tenants = dict(sorted(tenants.items()))
        return summary
