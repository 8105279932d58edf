"""The report's sections computed from paired frames as columns: agreement, categories, tenants, costs,
human labels and the sample size a verdict needs. Plain CPU work over values (numpy, scikit-learn): no I/O.

Each section with a video bootstrap is a *plan*: built from the columns, it lists the bootstrap it needs
(`groups()`), `quality.columns.run_bootstrap` feeds all plans' draws a slice at a time (plans over the
same videos share one draw), then `result()` gives the section. Counts per video, never per frame, go in.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from statsmodels.stats.inter_rater import cohens_kappa

from contracts.summaries import (
    CategoryRow,
    Coefficient,
    Comparison,
    HumanScore,
    McNemar,
    Rate,
    ReportPolicy,
    SampleSizeNeeded,
    TenantRow,
)
from quality.columns import IntArray, PairColumns, PairCounts, ResampleConsumer, run_bootstrap
from quality.stats import (
    BootstrapInterval,
    Proportion,
    TableBootstrap,
    TableStatistic,
    ac1_from_table,
    agreement_from_table,
    classification_scores,
    design_effect,
    flag_rate_difference_from_table,
    flagged_agreement_from_table,
    kappa_from_table,
    mcnemar_from_table,
    pabak_from_table,
    safe_agreement_from_table,
    sample_size_for_drop,
    wilson_interval,
)
from quality.week_stage import arm_cost
from shaping.verdict import ACTIONS

__all__ = [
    "CategoryPlan",
    "ComparisonPlan",
    "TenantPlan",
    "arm_cost",
    "compare",
    "human_scores",
    "sample_size_needed",
]


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
Group = tuple[int, int, int, ResampleConsumer]


class ComparisonPlan:
    """The reference arm against the candidate arm on the frames both judged, computed in two steps:
    `groups()` hands its bootstrap to `quality.columns.run_bootstrap`, then `result()`."""

    def __init__(self, pairs: PairCounts, policy: ReportPolicy) -> None:
        self.pairs, self.policy = pairs, policy
        self.counts = pairs.cells
        self.boot = TableBootstrap(policy.confidence)
        self.boot.add(self.counts, _STATISTICS)

    def groups(self) -> list[Group]:
        return [(self.boot.n_videos, self.policy.bootstrap_resamples, self.policy.seed, self.boot)]

    def result(self) -> Comparison:
        pairs, policy = self.pairs, self.policy
        a, b, c, d = (int(v) for v in self.counts.sum(axis=0))
        boot = self.boot.intervals(0, policy.bootstrap_resamples)
        n = len(pairs)
        agreement = _rate(a + d, n, boot["agreement"], policy.confidence)
        action_table = [[int(v) for v in row] for row in pairs.actions]
        action_same = sum(action_table[i][i] for i in range(len(ACTIONS)))
        grid = np.asarray(action_table)
        action_kappa: float | None = None
        if int(np.count_nonzero(grid.sum(axis=0) + grid.sum(axis=1))) > 1:
            # statsmodels' kappa of the 3x3 table (scikit-learn's of the same table as weighted label pairs
            # agrees to the last digits; a test holds them together): importing scikit-learn was a tenth
            # of the 250,000-pair report's CPU
            value = float(cohens_kappa(grid.astype(np.float64), return_results=False))
            action_kappa = value if math.isfinite(value) else None
        test = mcnemar_from_table(both=a, reference_only=b, candidate_only=c, neither=d)
        return Comparison(
            reference=pairs.reference,  # type: ignore[arg-type]  # an arm name from ARMS
            candidate=pairs.candidate,  # type: ignore[arg-type]  # (the same)
            frames=n,
            videos=pairs.n_videos,
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


def compare(pairs: PairColumns, policy: ReportPolicy) -> Comparison:
    """The reference arm against the candidate arm on the frames both judged."""
    plan = ComparisonPlan(PairCounts.from_columns(pairs), policy)
    run_bootstrap(plan.groups())
    return plan.result()


class CategoryPlan:
    """Agreement on flagged frames per category, most flagged first; thin categories listed, not judged."""

    def __init__(self, pairs: PairCounts, policy: ReportPolicy) -> None:
        self.pairs, self.policy = pairs, policy
        self.boot = TableBootstrap(policy.confidence)
        self.rows: list[tuple[str, IntArray, int]] = []
        for name, counts in pairs.categories.items():
            self.rows.append((name, counts, self.boot.add(counts, {"flagged": flagged_agreement_from_table})))

    def groups(self) -> list[Group]:
        if not self.rows:
            return []
        return [(self.boot.n_videos, self.policy.bootstrap_resamples, self.policy.seed, self.boot)]

    def result(self) -> list[CategoryRow]:
        policy, n = self.policy, len(self.pairs)
        rows = []
        for name, counts, index in self.rows:
            both, ref_only, cand_only, _ = (int(v) for v in counts.sum(axis=0))
            flagged: Rate | None = None
            if both + ref_only:
                boot = self.boot.intervals(index, policy.bootstrap_resamples)
                flagged = _rate(both, both + ref_only, boot["flagged"], policy.confidence)
            judged = both + ref_only >= policy.min_category_flagged
            rows.append(
                CategoryRow(
                    category=name,
                    reference_flagged=both + ref_only,
                    candidate_flagged=both + cand_only,
                    both_flagged=both,
                    reference_rate=(both + ref_only) / n,
                    candidate_rate=(both + cand_only) / n,
                    flagged_agreement=flagged,
                    judged=judged,
                    below_threshold=judged
                    and flagged is not None
                    and flagged.value < policy.min_flagged_agreement,
                    unsettled=judged
                    and flagged is not None
                    and flagged.value >= policy.min_flagged_agreement
                    and flagged.low < policy.min_flagged_agreement,
                )
            )
        rows.sort(key=lambda row: (-row.reference_flagged, row.category))
        return rows


class TenantPlan:
    """Agreement per tenant, largest first (each tenant's videos bootstrapped on their own)."""

    _STATS: ClassVar[dict[str, TableStatistic]] = {
        "agreement": agreement_from_table,
        "flagged": flagged_agreement_from_table,
    }

    def __init__(self, pairs: PairCounts, policy: ReportPolicy) -> None:
        self.policy = policy
        self.tenants: list[tuple[str, int, IntArray, TableBootstrap]] = []
        for tenant in pairs.tenants:
            boot = TableBootstrap(policy.confidence)
            boot.add(tenant.cells, self._STATS)
            self.tenants.append((tenant.tenant, tenant.frames, tenant.cells, boot))

    def groups(self) -> list[Group]:
        return [
            (boot.n_videos, self.policy.bootstrap_resamples, self.policy.seed, boot)
            for _, _, _, boot in self.tenants
        ]

    def result(self) -> list[TenantRow]:
        policy, rows = self.policy, []
        for tenant, frames, counts, boot in self.tenants:
            a, b, _, d = (int(v) for v in counts.sum(axis=0))
            intervals = boot.intervals(0, policy.bootstrap_resamples)
            rows.append(
                TenantRow(
                    tenant=tenant,
                    frames=frames,
                    agreement=_rate(a + d, frames, intervals["agreement"], policy.confidence),
                    flagged_agreement=_rate(a, a + b, intervals["flagged"], policy.confidence)
                    if a + b
                    else None,
                )
            )
        return rows


def _wilson_rate(proportion: Proportion) -> Rate:
    return Rate(
        k=proportion.k,
        n=proportion.n,
        value=proportion.value,
        wilson_low=proportion.low,
        wilson_high=proportion.high,
    )


def human_scores(pairs: PairCounts, policy: ReportPolicy) -> list[HumanScore]:
    """Each arm against the human labels; empty when no pair has one."""
    if not pairs.labelled.any():
        return []
    # the labelled pairs back as flags, from their (label, reference, candidate) counts: scikit-learn's
    # confusion matrix counts them again
    label, reference, candidate = np.unravel_index(np.arange(8), (2, 2, 2))
    times = pairs.labelled.reshape(-1)
    truth = np.repeat(label, times).astype(np.bool_)
    scores = []
    for arm, predicted in (
        (pairs.reference, np.repeat(reference, times).astype(np.bool_)),
        (pairs.candidate, np.repeat(candidate, times).astype(np.bool_)),
    ):
        result = classification_scores(truth, predicted, policy.confidence)
        scores.append(
            HumanScore(
                arm=arm,  # type: ignore[arg-type]  # an arm name from ARMS
                frames=int(truth.size),
                accuracy=_wilson_rate(result.accuracy),
                precision=_wilson_rate(result.precision) if result.precision else None,
                recall=_wilson_rate(result.recall) if result.recall else None,
            )
        )
    return scores


def sample_size_needed(comparison: Comparison, policy: ReportPolicy) -> SampleSizeNeeded | None:
    """The frames a week needs to detect the policy's drop (None when the drop reaches the baseline)."""
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
