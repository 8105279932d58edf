"""Ground truth: records synthesized from known rates, through the store and the report, recover them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contracts.records import JsonlRecordStore, pair_records
from quality.report import ReportPolicy, build_weekly_report
from quality.stats import PairedFlags, agreement_from_table, flagged_agreement_from_table, video_bootstrap_cis
from tests.quality.fakes import synthesize_week

# 3 % of frames flip when thinking is turned off: thinking on flags 3 %, thinking off misses 10 % of
# those and flags 2.78 % of the rest, so disagreement = 0.03 × 0.10 + 0.97 × 0.0278 ≈ 3.0 %.
FLAG_RATE, MISS, FALSE_FLAG = 0.03, 0.10, 0.0278


async def test_a_known_three_percent_flip_rate_is_recovered_inside_its_interval(tmp_path: Path) -> None:
    week = synthesize_week(
        frames=3000, videos=300, flag_rate=FLAG_RATE, flip_on_flagged=MISS, flip_on_safe=FALSE_FLAG, seed=48
    )
    store = JsonlRecordStore(tmp_path)
    for record in week.records:
        await store.append(record)
    await store.aclose()
    records = await JsonlRecordStore(tmp_path).read_week(2026, 48)
    assert len(records) == 6000

    report = build_weekly_report(records, "2026-W48", ReportPolicy(bootstrap_resamples=2000))
    comparison = report.comparison
    assert comparison is not None
    assert (comparison.frames, comparison.videos) == (3000, 300)
    true_agreement, true_flagged = 1 - week.disagreement, 1 - MISS
    agreement, flagged = comparison.agreement, comparison.flagged_agreement
    assert flagged is not None
    assert agreement.bootstrap_low is not None
    assert agreement.bootstrap_high is not None
    print(
        f"\nground truth: agreement {true_agreement:.4f}, recovered {agreement.value:.4f} "
        f"Wilson [{agreement.wilson_low:.4f}, {agreement.wilson_high:.4f}] "
        f"video bootstrap [{agreement.bootstrap_low:.4f}, {agreement.bootstrap_high:.4f}]; "
        f"flagged {true_flagged:.3f}, recovered {flagged.value:.4f} of {flagged.n} "
        f"[{flagged.low:.4f}, {flagged.high:.4f}]; design effect {comparison.design_effect:.2f}"
    )
    assert agreement.bootstrap_low <= true_agreement <= agreement.bootstrap_high
    assert agreement.low <= true_agreement <= agreement.high
    assert flagged.low <= true_flagged <= flagged.high
    assert abs(agreement.value - true_agreement) < 0.01


def test_the_intervals_cover_the_truth_at_about_their_nominal_rate() -> None:
    """Forty independent weeks of the same process: the 95 % video intervals should miss about two."""
    true_agreement = 1 - (FLAG_RATE * MISS + (1 - FLAG_RATE) * FALSE_FLAG)
    hits = flagged_hits = 0
    for seed in range(40):
        week = synthesize_week(
            frames=3000,
            videos=300,
            flag_rate=FLAG_RATE,
            flip_on_flagged=MISS,
            flip_on_safe=FALSE_FLAG,
            seed=seed,
        )
        pairs = pair_records(week.records).pairs
        flags = PairedFlags.from_sequences(
            np.array([p.reference.flagged for p in pairs]),
            np.array([p.candidate.flagged for p in pairs]),
            [p.video_id for p in pairs],
        )
        intervals = video_bootstrap_cis(
            flags, {"agreement": agreement_from_table, "flagged": flagged_agreement_from_table}, 1000, seed
        )
        hits += intervals["agreement"].contains(true_agreement)
        flagged_hits += intervals["flagged"].contains(1 - MISS)
    print(f"\ncoverage over 40 weeks: agreement {hits}/40, flagged agreement {flagged_hits}/40")
    assert hits >= 34
    assert flagged_hits >= 33
