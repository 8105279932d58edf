"""The engine as an arm: one engine's verdicts against another's on the same frames (issue 26, part 5).

Records carry the kind of engine that judged them (`VerdictRecord.engine`: vllm or llamacpp). When a week
holds records of more than one engine, each arm judged by both (thinking off on vLLM and on llama.cpp,
say) is compared as the report compares thinking off with thinking on: the primary engine as reference,
the other as candidate, the same statistics and video bootstrap, and a recommendation on switching.
"""

from __future__ import annotations

from collections.abc import Sequence

from contracts.summaries import (
    ENGINE_NAMES,
    EngineComparison,
    EngineDecision,
    EngineSection,
    Rate,
    ReportPolicy,
)
from quality.notation import count, interval, pct
from quality.recommendation import failing_categories_text, unsettled_categories_text
from quality.sections import CategoryPlan, ComparisonPlan, Group
from quality.week_stage import EngineCounts, primary_engine

__all__ = ["engine_comparison_plans", "engine_section", "primary_engine"]


def engine_name(kind: str) -> str:
    return ENGINE_NAMES.get(kind, kind)


class EnginePlan(ComparisonPlan):
    """One arm on the reference engine against the same arm on another engine."""

    def __init__(self, counts: EngineCounts, primary: str, policy: ReportPolicy) -> None:
        super().__init__(counts.pairs, policy)
        self.arm, self.engines, self.cost = counts.arm, (primary, counts.other), counts.cost
        self.categories = CategoryPlan(counts.pairs, policy)

    def groups(self) -> list[Group]:
        return [*super().groups(), *self.categories.groups()]


def engine_comparison_plans(
    engines: Sequence[EngineCounts], primary: str, policy: ReportPolicy
) -> list[tuple[str, EnginePlan]]:
    """A plan per (other engine, arm) that both engines judged; empty for a week of one engine."""
    return [(counts.other, EnginePlan(counts, primary, policy)) for counts in engines]


def _rate_text(rate: Rate) -> str:
    return f"{pct(rate.value)} {interval(rate.low, rate.high)}"


def engine_section(
    plans: Sequence[tuple[str, EnginePlan]], primary: str, policy: ReportPolicy
) -> EngineSection | None:
    """The report's engine section (its bootstrap already run), ending in a recommendation."""
    if not plans:
        return None
    other = plans[0][0]
    chosen = [plan for engine, plan in plans if engine == other]
    comparisons = []
    for plan in chosen:
        comparisons.append(
            EngineComparison(
                arm=plan.arm,
                comparison=plan.result(),
                candidate_cost=plan.cost,
                categories=plan.categories.result(),
            )
        )
    decision, headline = _recommend(comparisons, primary, other, policy)
    return EngineSection(
        reference_engine=primary,
        candidate_engine=other,
        comparisons=comparisons,
        decision=decision,
        headline=headline,
    )


def _recommend(
    comparisons: Sequence[EngineComparison], primary: str, other: str, policy: ReportPolicy
) -> tuple[EngineDecision, str]:
    """Switch only when every arm both engines judged clears both policy minimums, interval and all, and
    so does every category with enough flagged frames to be judged (the engine may flag the same frames
    and name other categories); a week with no judgeable category cannot recommend a switch."""
    a, b = engine_name(primary), engine_name(other)
    minimum = pct(policy.min_flagged_agreement, 0)
    lines, below, unsure = [], [], []
    for item in comparisons:
        comparison = item.comparison
        agreement, flagged = comparison.agreement, comparison.flagged_agreement
        text = (
            f"{item.arm.replace('_', ' ')}: {b} agrees {_rate_text(agreement)} with {a} over "
            f"{count(comparison.frames)} frames"
            + (f", {_rate_text(flagged)} on the {count(flagged.n)} frames {a} flagged" if flagged else "")
        )
        judged = [row for row in item.categories if row.judged and row.flagged_agreement is not None]
        failing = [row for row in judged if row.below_threshold]
        unsettled = [row for row in judged if row.unsettled]
        if failing:
            text += f"; {failing_categories_text(failing, judged, minimum)}"
        elif unsettled:
            text += f"; {unsettled_categories_text(unsettled, judged, minimum)}"
        elif judged:
            text += f"; every category judged ({count(len(judged))}) meets the flagged minimum"
        elif flagged is not None:
            text += (
                f"; no category has the {count(policy.min_category_flagged)} flagged frames it needs to "
                "be judged"
            )
        lines.append(text)
        if (
            agreement.value < policy.min_agreement
            or (flagged is not None and flagged.value < policy.min_flagged_agreement)
            or failing
        ):
            below.append(item.arm)
        elif (
            agreement.low < policy.min_agreement
            or flagged is None
            or flagged.low < policy.min_flagged_agreement
            or unsettled
            or not judged
        ):
            unsure.append(item.arm)
    minimums = f"{pct(policy.min_agreement, 0)}, {minimum} on flagged"
    evidence = "; ".join(lines)
    if below:
        return "keep_reference", f"{evidence}: below the policy minimums ({minimums}). Keep {a}."
    if unsure:
        return "inconclusive", (
            f"{evidence}, but the intervals still reach below the policy minimums ({minimums}). "
            f"Keep {a} until more frames settle it."
        )
    return "switch_ok", (
        f"{evidence}: every interval clears the policy minimums ({minimums}). {b} can replace {a} "
        "where this policy applies."
    )
