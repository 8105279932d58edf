"""Each statistic against a published worked example or an independent computation."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy.stats import binom, binomtest, norm
from sklearn.metrics import accuracy_score, cohen_kappa_score, precision_score, recall_score

from quality.stats import (
    AgreementTable,
    PairedFlags,
    ac1_from_table,
    agreement_from_table,
    classification_scores,
    cohen_kappa,
    flagged_agreement_from_table,
    gwet_ac1,
    kappa_from_table,
    mcnemar_exact,
    pabak,
    pabak_from_table,
    safe_agreement_from_table,
    sample_size_for_drop,
    video_bootstrap_ci,
    wilson_interval,
)


def two_raters(both: int, first_only: int, second_only: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    """Label vectors for a 2x2 table: (yes, yes), (yes, no), (no, yes), (no, no)."""
    first = np.array([True] * both + [True] * first_only + [False] * second_only + [False] * neither)
    second = np.array([True] * both + [False] * first_only + [True] * second_only + [False] * neither)
    return first, second


# --- Wilson -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),  # Newcombe (1998), Stat Med 17:857, Table I, method 3
        (15, 148, 0.0624, 0.1605),
        (0, 10, 0.0000, 0.2775),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_newcombe_1998(k: int, n: int, low: float, high: float) -> None:
    interval = wilson_interval(k, n)
    assert interval.value == pytest.approx(k / n)
    assert interval.low == pytest.approx(low, abs=5e-5)
    assert interval.high == pytest.approx(high, abs=5e-5)


def test_wilson_interval_matches_the_closed_form() -> None:
    for k, n, confidence in [(4116, 4210, 0.95), (113, 118, 0.9), (7, 7, 0.99)]:
        z = norm.ppf(1 - (1 - confidence) / 2)
        p = k / n
        centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
        half = z / (1 + z**2 / n) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
        interval = wilson_interval(k, n, confidence)
        assert interval.low == pytest.approx(centre - half, abs=1e-12)
        assert interval.high == pytest.approx(centre + half, abs=1e-12)


def test_wilson_interval_refuses_an_empty_sample() -> None:
    with pytest.raises(ValueError, match="n > 0"):
        wilson_interval(0, 0)


# --- kappa, PABAK, AC1 --------------------------------------------------------------------------------


def test_cohen_kappa_matches_the_wikipedia_worked_example() -> None:
    # Wikipedia, "Cohen's kappa", simple example: 50 proposals, p_o = 0.7, p_e = 0.5, kappa = 0.4.
    assert cohen_kappa(*two_raters(20, 5, 10, 15)) == pytest.approx(0.4)


def test_cohen_kappa_reproduces_the_wikipedia_paradox_tables() -> None:
    # Same 60 % agreement, different marginals: kappa 0.1304 and 0.2593 (Wikipedia, "Kappa paradox").
    assert cohen_kappa(*two_raters(45, 15, 25, 15)) == pytest.approx(0.1304, abs=5e-5)
    assert cohen_kappa(*two_raters(25, 35, 5, 35)) == pytest.approx(0.2593, abs=5e-5)


def test_pabak_and_ac1_by_hand_on_the_wikipedia_table() -> None:
    first, second = two_raters(20, 5, 10, 15)
    p_o = (20 + 15) / 50  # 0.7
    assert pabak(first, second) == pytest.approx(2 * p_o - 1)  # 0.4
    # AC1: pi_yes = mean of the raters' yes shares = (25/50 + 30/50) / 2 = 0.55
    #      p_e = 2 * pi * (1 - pi) = 2 * 0.55 * 0.45 = 0.495
    #      AC1 = (0.7 - 0.495) / (1 - 0.495) = 0.205 / 0.505 = 41/101
    assert gwet_ac1(first, second) == pytest.approx(41 / 101)


def test_at_a_three_percent_flag_rate_kappa_sinks_while_pabak_and_ac1_do_not() -> None:
    # 100 frames: 1 flagged by both, 2 by each arm alone, 95 by neither.
    first, second = two_raters(1, 2, 2, 95)
    # p_o = 96/100 = 0.96; each arm flags 3/100.
    # kappa: p_e = 0.03*0.03 + 0.97*0.97 = 0.9418 -> (0.96 - 0.9418) / 0.0582 = 0.3127
    assert cohen_kappa(first, second) == pytest.approx((0.96 - 0.9418) / (1 - 0.9418))
    assert cohen_kappa(first, second) == pytest.approx(0.3127, abs=5e-5)
    # PABAK: 2 * 0.96 - 1 = 0.92
    assert pabak(first, second) == pytest.approx(0.92)
    # AC1: pi = 0.03, p_e = 2 * 0.03 * 0.97 = 0.0582 -> (0.96 - 0.0582) / 0.9418 = 0.9575
    assert gwet_ac1(first, second) == pytest.approx((0.96 - 0.0582) / 0.9418)


def test_pabak_and_ac1_by_hand_with_three_actions() -> None:
    ref = ["allow"] * 6 + ["review"] * 2 + ["block"] * 2
    cand = ["allow"] * 5 + ["review"] + ["review", "allow"] + ["block", "block"]
    # agreement: 5 allow + 1 review + 2 block = 8 of 10
    assert pabak(ref, cand) == pytest.approx((3 * 0.8 - 1) / 2)  # 0.7
    # pi: allow (6 + 6)/20 = 0.6, review (2 + 2)/20 = 0.2, block (2 + 2)/20 = 0.2
    # p_e = (0.6*0.4 + 0.2*0.8 + 0.2*0.8) / (3 - 1) = 0.56 / 2 = 0.28
    assert gwet_ac1(ref, cand) == pytest.approx((0.8 - 0.28) / (1 - 0.28))
    assert cohen_kappa(ref, cand) == pytest.approx(cohen_kappa_score(ref, cand))


def test_table_statistics_equal_the_label_statistics_on_random_rare_flags() -> None:
    rng = np.random.default_rng(3)
    ref = rng.random(5000) < 0.03
    cand = np.where(rng.random(5000) < 0.02, ~ref, ref)
    table = PairedFlags.from_sequences(ref, cand).table()
    assert float(kappa_from_table(table)) == pytest.approx(cohen_kappa_score(ref, cand))
    assert float(pabak_from_table(table)) == pytest.approx(pabak(ref, cand))
    assert float(ac1_from_table(table)) == pytest.approx(gwet_ac1(ref, cand))
    assert float(agreement_from_table(table)) == pytest.approx(np.mean(ref == cand))
    assert float(flagged_agreement_from_table(table)) == pytest.approx(np.mean(cand[ref]))
    assert float(safe_agreement_from_table(table)) == pytest.approx(np.mean(~cand[~ref]))


def test_undefined_statistics_come_back_as_nan_not_errors() -> None:
    empty_flags = AgreementTable.from_counts(np.array([0, 0, 0, 10]))
    assert math.isnan(float(flagged_agreement_from_table(empty_flags)))
    assert math.isnan(float(kappa_from_table(empty_flags)))
    assert math.isnan(cohen_kappa([False] * 5, [False] * 5))


# --- McNemar --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("b", "c"), [(14, 3), (3, 14), (5, 5), (0, 7), (40, 25)])
def test_mcnemar_exact_is_the_binomial_test_on_discordant_frames(b: int, c: int) -> None:
    ref, cand = two_raters(20, b, c, 400)
    result = mcnemar_exact(ref, cand)
    assert (result.reference_only, result.candidate_only) == (b, c)
    assert result.p_value == pytest.approx(binomtest(b, b + c, 0.5).pvalue)


def test_mcnemar_says_which_way_thinking_off_moves() -> None:
    assert mcnemar_exact(*two_raters(20, 14, 3, 400)).direction == "thinking_off flags less"
    assert mcnemar_exact(*two_raters(20, 3, 14, 400)).direction == "thinking_off flags more"
    assert mcnemar_exact(*two_raters(20, 5, 5, 400)).direction == "thinking_off flags the same"
    identical = mcnemar_exact(*two_raters(20, 0, 0, 400))
    assert identical.p_value == 1.0
    assert not identical.significant()


# --- the video bootstrap ---------------------------------------------------------------------------------


def clustered_sample(
    rng: np.random.Generator, videos: int, frames_per_video: int, disagreement: float, concentration: float
) -> PairedFlags:
    """Frames whose disagreement rate varies by video around `disagreement` (population mean exact)."""
    rates = rng.beta(disagreement * concentration, (1 - disagreement) * concentration, size=videos)
    video = np.repeat(np.arange(videos), frames_per_video)
    ref = rng.random(video.size) < 0.03
    flip = rng.random(video.size) < rates[video]
    return PairedFlags(ref, ref ^ flip, video.astype(np.int64))


def test_video_bootstrap_covers_the_true_agreement_where_frame_intervals_do_not() -> None:
    rng = np.random.default_rng(11)
    truth, runs = 0.95, 200
    video_hits = wilson_hits = 0
    for run in range(runs):
        sample = clustered_sample(
            rng, videos=80, frames_per_video=15, disagreement=1 - truth, concentration=2
        )
        boot = video_bootstrap_ci(sample, agreement_from_table, n_resamples=600, seed=run)
        table = sample.table()
        wilson = wilson_interval(int(table.both_flagged + table.both_safe), len(sample))
        video_hits += boot.contains(truth)
        wilson_hits += wilson.contains(truth)
    # Nominal 95 %: the video bootstrap gets close; Wilson, treating correlated frames as
    # independent, is far too narrow here.
    assert video_hits / runs >= 0.85  # 0.89 with these seeds; percentile intervals run a little short
    assert wilson_hits / runs <= 0.80
    assert video_hits > wilson_hits


def test_video_bootstrap_is_reproducible_and_safe_to_run_in_threads() -> None:
    sample = clustered_sample(np.random.default_rng(5), 50, 20, 0.03, 10)
    expected = video_bootstrap_ci(sample, kappa_from_table, n_resamples=500, seed=9)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: video_bootstrap_ci(sample, kappa_from_table, 500, 9), range(8)))
    assert all(result == expected for result in results)
    assert expected.low <= expected.estimate <= expected.high


def test_frames_without_a_video_are_their_own_cluster() -> None:
    flags = PairedFlags.from_sequences([True, False, False], [True, True, False], ["a", None, None])
    assert flags.n_videos == 3
    assert PairedFlags.from_sequences([True, False], [True, False], ["a", "a"]).n_videos == 1


# --- human labels -----------------------------------------------------------------------------------------


def test_classification_scores_agree_with_sklearn() -> None:
    rng = np.random.default_rng(2)
    truth = rng.random(600) < 0.05
    predicted = np.where(rng.random(600) < 0.03, ~truth, truth)
    scores = classification_scores(truth, predicted)
    assert scores.accuracy.value == pytest.approx(accuracy_score(truth, predicted))
    assert scores.precision is not None
    assert scores.recall is not None
    assert scores.precision.value == pytest.approx(precision_score(truth, predicted))
    assert scores.recall.value == pytest.approx(recall_score(truth, predicted))
    assert scores.recall.low < scores.recall.value < scores.recall.high


def test_precision_is_undefined_when_an_arm_flags_nothing() -> None:
    scores = classification_scores([True, False, False], [False, False, False])
    assert scores.precision is None
    assert scores.recall is not None
    assert scores.recall.value == 0


# --- sample size ------------------------------------------------------------------------------------------


def _p1_for_h(p0: float, h: float) -> float:
    """The proportion whose arcsine distance below p0 is exactly h (Cohen's h = 2 asin√p0 − 2 asin√p1)."""
    return math.sin(math.asin(math.sqrt(p0)) - h / 2) ** 2


def test_sample_size_matches_cohens_power_table_for_h() -> None:
    # Cohen (1988), Table 6.4.1: h = .20, two-sided a = .05, power .80 -> n = 392 per sample.
    drop = 0.5 - _p1_for_h(0.5, 0.2)
    size = sample_size_for_drop(0.5, drop, alpha=0.05, power=0.8, design="two_sample", two_sided=True)
    assert size.effect_size_h == pytest.approx(0.2)
    assert abs(size.frames - 392) <= 1


def test_one_sample_size_matches_the_arcsine_formula_and_exact_binomial_power() -> None:
    p0, drop = 0.98, 0.01
    size = sample_size_for_drop(p0, drop)
    h = 2 * math.asin(math.sqrt(p0)) - 2 * math.asin(math.sqrt(p0 - drop))
    by_formula = ((norm.ppf(0.95) + norm.ppf(0.80)) / h) ** 2
    assert size.frames == math.ceil(by_formula)
    # Independent check: the exact one-sided binomial test at that n detects p0 - drop ~80 % of the time.
    n = size.frames
    critical = binom.ppf(0.05, n, p0)  # reject when agreements fall at or below this count
    if binom.cdf(critical, n, p0) > 0.05:
        critical -= 1
    power = binom.cdf(critical, n, p0 - drop)
    assert 0.72 <= power <= 0.88


def test_two_sample_design_needs_about_twice_the_frames() -> None:
    one = sample_size_for_drop(0.97, 0.01).frames
    two = sample_size_for_drop(0.97, 0.01, design="two_sample").frames
    assert two == pytest.approx(2 * one, rel=0.01)


def test_sample_size_rejects_a_drop_larger_than_the_baseline() -> None:
    with pytest.raises(ValueError, match="drop"):
        sample_size_for_drop(0.01, 0.02)
