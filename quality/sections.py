"""The report's sections computed from paired records: agreement, categories, tenants, costs, human
labels and the sample size a verdict needs. Plain CPU work over values (numpy, scikit-learn): no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
from sklearn.metrics import cohen_kappa_score

from quality.records import ARMS, PairedRecord, VerdictRecord
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
from quality.summaries import (
    ArmCost,
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
from shaping.verdict import ACTIONS

__all__ = ["arm_costs", "category_rows", "compare", "human_scores", "sample_size_needed", "tenant_rows"]


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


def compare(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> Comparison:
    """The reference arm against the candidate arm on the frames both judged."""
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


def category_rows(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> list[CategoryRow]:
    """Agreement on flagged frames per category, most flagged first; thin categories listed, not judged."""
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


def tenant_rows(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> list[TenantRow]:
    """Agreement per tenant, largest first."""
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


def arm_costs(records: Sequence[VerdictRecord]) -> list[ArmCost]:
    """Latency and tokens per arm, over fresh verdicts only (cache hits are counted, not timed)."""
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


def human_scores(pairs: Sequence[PairedRecord], policy: ReportPolicy) -> list[HumanScore]:
    """Each arm against the human labels; empty when no pair has one."""
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
