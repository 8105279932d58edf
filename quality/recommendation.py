"""The report's recommendation: the decision on turning thinking off, its headline and the detail lines.

Judged from a built report: its comparison intervals against the policy minimums, and every category it
judges against the flagged minimum (a headline must never pass a policy its own category table fails);
sentences only, no statistics computed here.
"""

from __future__ import annotations

from contracts.summaries import CategoryRow, Decision, Rate, Recommendation, WeeklyReport
from quality.notation import count, interval, pct, points, points_interval

__all__ = ["failing_categories_text", "recommend", "unsettled_categories_text"]


def _rate_text(rate: Rate) -> str:
    return f"{pct(rate.value)} {interval(rate.low, rate.high)}"


def recommend(report: WeeklyReport) -> Recommendation:
    """The decision on thinking off for the week, its title, headline and detail lines."""
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
    # every category the report judges is held to the flagged minimum too, as the table beside it says
    judged = [row for row in report.categories if row.judged and row.flagged_agreement is not None]
    failing = [row for row in judged if row.below_threshold]
    # held to the same interval bound as the overall figure: a category whose interval still reaches below
    # the minimum is not settled, and a week where no category has the frames to be judged cannot pass
    unsettled = [row for row in judged if row.unsettled]
    categories_ok = bool(judged) and not unsettled

    decision: Decision
    if agreement_below or flagged_below or failing:
        decision, title = "keep_thinking_on", "Keep thinking on"
        reasons = []
        if agreement_below and flagged_below:
            reasons.append(f"both below the policy minimums ({min_all}, {min_flagged} on flagged)")
        elif agreement_below:
            reasons.append(f"below the {min_all} policy minimum")
        elif flagged_below:
            reasons.append(f"the flagged figure is below the {min_flagged} policy minimum")
        if failing:
            reasons.append(failing_categories_text(failing, judged, min_flagged))
        headline = f"{evidence}: {'; '.join(reasons)}. Keep thinking on."
    elif agreement_ok and flagged_ok and categories_ok:
        decision, title = "thinking_off_ok", "Thinking off meets policy"
        headline = (
            f"{evidence}: both intervals clear the policy minimums ({min_all}, {min_flagged} on flagged), "
            f"and every category judged ({count(len(judged))}) meets the flagged minimum. Thinking can be "
            "turned off where this policy applies."
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
        if flagged is not None and not judged:
            short.append(
                f"no category has the {count(policy.min_category_flagged)} flagged frames it needs to be "
                "judged"
            )
        elif unsettled:
            short.append(unsettled_categories_text(unsettled, judged, min_flagged))
        headline = f"{evidence}, but {' and '.join(short)}. Keep thinking on"
        if report.sample_size is not None:
            needed = max(report.sample_size.frames, report.sample_size.frames_for_flagged or 0)
            headline += f" until about {count(needed)} paired frames settle it"
        headline += "."

    return Recommendation(decision=decision, title=title, headline=headline, details=_details(report))


def failing_categories_text(failing: list[CategoryRow], judged: list[CategoryRow], min_flagged: str) -> str:
    """Which judged categories are below the flagged minimum, for a headline."""
    if len(failing) == len(judged):
        scope = "every category judged" if len(judged) > 1 else "the one category judged"
        return f"{scope} ({count(len(judged))}) is below the {min_flagged} flagged minimum"
    names = ", ".join(
        f"{row.category} {pct(row.flagged_agreement.value)}" for row in failing[:3] if row.flagged_agreement
    )
    more = f" and {count(len(failing) - 3)} more" if len(failing) > 3 else ""
    return (
        f"{count(len(failing))} of {count(len(judged))} categories judged are below the {min_flagged} "
        f"flagged minimum ({names}{more})"
    )


def unsettled_categories_text(
    unsettled: list[CategoryRow], judged: list[CategoryRow], min_flagged: str
) -> str:
    """Which judged categories' intervals still reach below the flagged minimum, for a headline."""
    names = ", ".join(
        f"{row.category} {_rate_text(row.flagged_agreement)}"
        for row in unsettled[:3]
        if row.flagged_agreement
    )
    more = f" and {count(len(unsettled) - 3)} more" if len(unsettled) > 3 else ""
    return (
        f"the interval of {count(len(unsettled))} of {count(len(judged))} categories judged still reaches "
        f"below the {min_flagged} flagged minimum ({names}{more})"
    )


def _details(report: WeeklyReport) -> list[str]:
    comparison, policy = report.comparison, report.policy
    assert comparison is not None
    details = []
    test, diff = comparison.mcnemar, comparison.flag_rate_difference
    shift = (
        f"flag rate {pct(comparison.reference_flag_rate, 2)} → {pct(comparison.candidate_flag_rate, 2)}, "
        f"difference {points(diff.value)} {points_interval(diff.low, diff.high)} by video bootstrap"
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
    unsettled = [row for row in report.categories if row.unsettled and row.flagged_agreement]
    if unsettled:
        listed = "; ".join(
            f"{row.category} {_rate_text(row.flagged_agreement)} of {count(row.flagged_agreement.n)}"
            for row in unsettled
            if row.flagged_agreement
        )
        details.append(f"Not settled yet (the interval reaches below the flagged minimum): {listed}.")
    if not failing and not unsettled and any(row.judged for row in report.categories):
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
