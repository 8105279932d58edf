"""Agreement statistics between two verdict arms, as pure functions over arrays.

Nothing here keeps state: every function takes values and returns frozen values, and randomness comes
from a `numpy.random.Generator` seeded per call, so any of them can run in a worker thread.

Vocabulary: the *reference* arm is the one operators trust today (thinking on); the *candidate* is the
arm being evaluated (thinking off, or a thinking-on re-run for the noise floor). "Flagged frames" are the
frames the reference flagged; agreement on them is the share the candidate also flagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_confint, proportion_effectsize

from quality.columns import run_bootstrap

__all__ = [
    "AgreementTable",
    "BootstrapInterval",
    "ClassificationScores",
    "McNemarResult",
    "PairedFlags",
    "Proportion",
    "SampleSize",
    "TableBootstrap",
    "TableStatistic",
    "ac1_from_table",
    "agreement_from_table",
    "classification_scores",
    "cohen_kappa",
    "design_effect",
    "flag_rate_difference_from_table",
    "flagged_agreement_from_table",
    "gwet_ac1",
    "kappa_from_table",
    "mcnemar_exact",
    "mcnemar_from_table",
    "pabak",
    "pabak_from_table",
    "safe_agreement_from_table",
    "sample_size_for_drop",
    "video_bootstrap_ci",
    "video_bootstrap_cis",
    "wilson_interval",
]

FloatArray = NDArray[np.float64]
Direction = Literal["thinking_off flags more", "thinking_off flags less", "thinking_off flags the same"]


@dataclass(frozen=True, slots=True)
class Proportion:
    """`k` successes out of `n`, with a confidence interval for the underlying rate."""

    k: int
    n: int
    value: float
    low: float
    high: float
    confidence: float = 0.95

    def contains(self, rate: float) -> bool:
        return self.low <= rate <= self.high


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> Proportion:
    """The Wilson score interval (no continuity correction), via statsmodels.

    Wilson rather than the normal approximation: it stays inside [0, 1] and keeps close to nominal
    coverage near 0 and 1, which is where agreement rates of 95–100 % live.
    """
    if n <= 0:
        raise ValueError("a proportion needs n > 0")
    if not 0 <= k <= n:
        raise ValueError(f"k={k} must lie in [0, n={n}]")
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie strictly between 0 and 1")
    low, high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    return Proportion(k=k, n=n, value=k / n, low=float(low), high=float(high), confidence=confidence)


# --- agreement coefficients on label vectors -------------------------------------------------------


def _as_labels(values: ArrayLike) -> NDArray[np.generic]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError("labels must be one-dimensional")
    return array


def _paired(reference: ArrayLike, candidate: ArrayLike) -> tuple[NDArray[np.generic], NDArray[np.generic]]:
    ref, cand = _as_labels(reference), _as_labels(candidate)
    if ref.shape != cand.shape:
        raise ValueError(f"reference has {ref.size} labels, candidate {cand.size}")
    if ref.size == 0:
        raise ValueError("no paired labels")
    return ref, cand


def cohen_kappa(reference: ArrayLike, candidate: ArrayLike) -> float:
    """Cohen's kappa (unweighted), via scikit-learn; `nan` when chance agreement is total."""
    ref, cand = _paired(reference, candidate)
    if np.array_equal(np.unique(ref), np.unique(cand)) and np.unique(ref).size == 1:
        # Both raters used one and the same category: kappa is 0/0. sklearn warns and returns nan.
        return math.nan
    # scikit-learn is imported only here and in classification_scores (the report's labels section): the
    # report without human labels uses neither, and importing it was a tenth of its CPU at 250,000 pairs
    from sklearn.metrics import cohen_kappa_score

    return float(cohen_kappa_score(ref, cand))


def _categories(
    ref: NDArray[np.generic], cand: NDArray[np.generic], categories: Sequence[Hashable] | None
) -> int:
    if categories is not None:
        return len(categories)
    if ref.dtype == np.bool_ and cand.dtype == np.bool_:
        return 2
    return max(2, np.union1d(ref, cand).size)


def pabak(reference: ArrayLike, candidate: ArrayLike, categories: Sequence[Hashable] | None = None) -> float:
    """Prevalence- and bias-adjusted kappa (Byrt, Bishop & Carlin 1993): (q·p_o − 1)/(q − 1).

    With two categories this is 2·p_o − 1: kappa with chance agreement fixed at 1/q, so it does not
    collapse when one category is rare. `categories` gives q when not every category occurs.
    """
    ref, cand = _paired(reference, candidate)
    q = _categories(ref, cand, categories)
    observed = float(np.mean(ref == cand))
    return (q * observed - 1) / (q - 1)


def gwet_ac1(
    reference: ArrayLike, candidate: ArrayLike, categories: Sequence[Hashable] | None = None
) -> float:
    """Gwet's AC1 (Gwet 2008) for two raters: (p_o − p_e)/(1 − p_e), p_e = Σ π_k(1 − π_k)/(q − 1).

    π_k is the mean of the two raters' shares of category k. Unlike kappa's p_e, this one is small when
    the raters agree that one category is rare, so AC1 stays interpretable at a 2–3 % flag rate.
    """
    ref, cand = _paired(reference, candidate)
    levels = list(categories) if categories is not None else list(np.union1d(ref, cand))
    q = _categories(ref, cand, categories)
    observed = float(np.mean(ref == cand))
    pi = np.array([(np.mean(ref == level) + np.mean(cand == level)) / 2 for level in levels])
    chance = float(np.sum(pi * (1 - pi)) / (q - 1))
    if chance >= 1:
        return math.nan
    return (observed - chance) / (1 - chance)


# --- the 2x2 table and statistics over it (vectorised for the bootstrap) -------------------------


@dataclass(frozen=True, slots=True)
class AgreementTable:
    """Counts of the 2x2 flagged table; each field is an array so one call scores many resamples."""

    both_flagged: FloatArray
    reference_only: FloatArray
    candidate_only: FloatArray
    both_safe: FloatArray

    @classmethod
    def from_counts(cls, counts: NDArray[np.int64] | NDArray[np.float64]) -> AgreementTable:
        """From an (..., 4) array ordered both_flagged, reference_only, candidate_only, both_safe."""
        values = np.asarray(counts, dtype=np.float64)
        return cls(values[..., 0], values[..., 1], values[..., 2], values[..., 3])

    @property
    def total(self) -> FloatArray:
        return self.both_flagged + self.reference_only + self.candidate_only + self.both_safe


TableStatistic = Callable[[AgreementTable], FloatArray]


def _ratio(numerator: FloatArray, denominator: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(numerator / denominator, dtype=np.float64)


def agreement_from_table(t: AgreementTable) -> FloatArray:
    return _ratio(t.both_flagged + t.both_safe, t.total)


def flagged_agreement_from_table(t: AgreementTable) -> FloatArray:
    """Share of the reference's flagged frames that the candidate flagged too."""
    return _ratio(t.both_flagged, t.both_flagged + t.reference_only)


def safe_agreement_from_table(t: AgreementTable) -> FloatArray:
    """Share of the reference's safe frames that the candidate left unflagged too."""
    return _ratio(t.both_safe, t.both_safe + t.candidate_only)


def kappa_from_table(t: AgreementTable) -> FloatArray:
    n = t.total
    observed = _ratio(t.both_flagged + t.both_safe, n)
    ref_flag = _ratio(t.both_flagged + t.reference_only, n)
    cand_flag = _ratio(t.both_flagged + t.candidate_only, n)
    chance = ref_flag * cand_flag + (1 - ref_flag) * (1 - cand_flag)
    return _ratio(observed - chance, 1 - chance)


def pabak_from_table(t: AgreementTable) -> FloatArray:
    return 2 * agreement_from_table(t) - 1


def ac1_from_table(t: AgreementTable) -> FloatArray:
    n = t.total
    observed = _ratio(t.both_flagged + t.both_safe, n)
    prevalence = _ratio(2 * t.both_flagged + t.reference_only + t.candidate_only, 2 * n)
    chance = 2 * prevalence * (1 - prevalence)
    return _ratio(observed - chance, 1 - chance)


def flag_rate_difference_from_table(t: AgreementTable) -> FloatArray:
    """Candidate flag rate minus reference flag rate: positive when thinking off flags more."""
    return _ratio(t.candidate_only - t.reference_only, t.total)


# --- paired flags with their videos ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PairedFlags:
    """Two arms' flagged decisions on the same frames, and each frame's video as a cluster index."""

    reference: NDArray[np.bool_]
    candidate: NDArray[np.bool_]
    videos: NDArray[np.int64]

    def __post_init__(self) -> None:
        if not (self.reference.shape == self.candidate.shape == self.videos.shape):
            raise ValueError("reference, candidate and videos must have the same length")
        if self.reference.ndim != 1:
            raise ValueError("paired flags are one-dimensional")

    @classmethod
    def from_sequences(
        cls,
        reference: Sequence[bool] | NDArray[np.bool_],
        candidate: Sequence[bool] | NDArray[np.bool_],
        video_ids: Sequence[str | None] | None = None,
    ) -> PairedFlags:
        """Frames without a video id are their own cluster: nothing says they are correlated."""
        ref = np.asarray(reference, dtype=np.bool_)
        cand = np.asarray(candidate, dtype=np.bool_)
        if video_ids is None:
            videos = np.arange(ref.size, dtype=np.int64)
        else:
            index: dict[str, int] = {}
            codes = []
            for position, video in enumerate(video_ids):
                key = f"v:{video}" if video is not None else f"f:{position}"
                codes.append(index.setdefault(key, len(index)))
            videos = np.asarray(codes, dtype=np.int64)
        return cls(ref, cand, videos)

    def __len__(self) -> int:
        return int(self.reference.size)

    @property
    def n_videos(self) -> int:
        return int(np.unique(self.videos).size)

    def table(self) -> AgreementTable:
        return AgreementTable.from_counts(self.cluster_counts().sum(axis=0))

    def cluster_counts(self) -> NDArray[np.int64]:
        """(n_videos, 4) counts per video: both_flagged, reference_only, candidate_only, both_safe."""
        _, clusters = np.unique(self.videos, return_inverse=True)
        cell = np.where(
            self.reference,
            np.where(self.candidate, 0, 1),
            np.where(self.candidate, 2, 3),
        )
        counts = np.zeros((int(clusters.max(initial=-1)) + 1, 4), dtype=np.int64)
        np.add.at(counts, (clusters, cell), 1)
        return counts


# --- the video (cluster) bootstrap ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BootstrapInterval:
    """A percentile interval from resampling whole videos; `n_valid` resamples had a defined value."""

    estimate: float
    low: float
    high: float
    standard_error: float
    n_resamples: int
    n_valid: int
    n_videos: int
    confidence: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


class TableBootstrap:
    """Video-bootstrap intervals for several 2x2 tables over the same videos, fed weights a slice at a time.

    Each request is a (videos, 4) matrix of per-video counts (both_flagged, reference_only,
    candidate_only, both_safe) and the statistics wanted of it; every request sees the same resamples.
    A `quality.columns.ResampleConsumer`: `quality.columns.run_bootstrap` feeds it.
    """

    def __init__(self, confidence: float = 0.95) -> None:
        self.confidence = confidence
        self._counts: list[NDArray[np.int64]] = []
        self._statistics: list[Mapping[str, TableStatistic]] = []
        self._values: list[dict[str, list[FloatArray]]] = []
        self._stacked: FloatArray | None = None

    def add(self, counts: NDArray[np.int64], statistics: Mapping[str, TableStatistic]) -> int:
        """Ask for `statistics` of a table; returns the request's index for `intervals`."""
        if self._counts and counts.shape[0] != self._counts[0].shape[0]:
            raise ValueError("every table of one bootstrap must count the same videos")
        self._counts.append(np.asarray(counts, dtype=np.int64))
        self._statistics.append(statistics)
        self._values.append({name: [] for name in statistics})
        self._stacked = None
        return len(self._counts) - 1

    @property
    def n_videos(self) -> int:
        return int(self._counts[0].shape[0]) if self._counts else 0

    def feed(self, start: int, weights: FloatArray) -> None:
        if self._stacked is None:
            self._stacked = np.hstack(self._counts).astype(np.float64)
        # integer counts in float64: every sum is exact (far below 2**53), so BLAS gives the int result
        resampled = weights @ self._stacked
        for index, statistics in enumerate(self._statistics):
            table = AgreementTable.from_counts(resampled[:, 4 * index : 4 * index + 4])
            for name, statistic in statistics.items():
                self._values[index][name].append(statistic(table))

    def intervals(self, index: int, n_resamples: int) -> dict[str, BootstrapInterval]:
        counts = self._counts[index]
        observed = AgreementTable.from_counts(counts.sum(axis=0))
        tail = (1 - self.confidence) / 2
        intervals: dict[str, BootstrapInterval] = {}
        for name, statistic in self._statistics[index].items():
            estimate = float(statistic(observed))
            chunks = self._values[index][name]
            values = np.concatenate(chunks) if chunks else np.zeros(0)
            valid = values[np.isfinite(values)]
            if valid.size == 0:
                low = high = se = math.nan
            else:
                low, high = (float(v) for v in np.quantile(valid, [tail, 1 - tail]))
                se = float(np.std(valid, ddof=1)) if valid.size > 1 else 0.0
            intervals[name] = BootstrapInterval(
                estimate=estimate,
                low=low,
                high=high,
                standard_error=se,
                n_resamples=n_resamples,
                n_valid=int(valid.size),
                n_videos=counts.shape[0],
                confidence=self.confidence,
            )
        return intervals


def video_bootstrap_cis(
    pairs: PairedFlags,
    statistics: Mapping[str, TableStatistic],
    n_resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, BootstrapInterval]:
    """Percentile intervals for several statistics from one set of resampled videos.

    Frames of one video are correlated (same scene, same uploader), so resampling frames would make
    the intervals too narrow. Drawing videos with replacement is the same as giving each video a
    Multinomial(n_videos, 1/n_videos) weight, so each resample's 2x2 table is weights @ per-video
    counts: no frame-level copying, and every statistic sees the same resamples.
    """
    if len(pairs) == 0:
        raise ValueError("no paired frames to resample")
    if n_resamples < 1:
        raise ValueError("n_resamples must be positive")
    boot = TableBootstrap(confidence)
    boot.add(pairs.cluster_counts(), statistics)
    run_bootstrap([(boot.n_videos, n_resamples, seed, boot)])
    return boot.intervals(0, n_resamples)


def video_bootstrap_ci(
    pairs: PairedFlags,
    statistic: TableStatistic,
    n_resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapInterval:
    """One statistic's percentile interval from resampling whole videos (see `video_bootstrap_cis`)."""
    return video_bootstrap_cis(pairs, {"statistic": statistic}, n_resamples, seed, confidence)["statistic"]


def design_effect(bootstrap: BootstrapInterval, proportion: Proportion) -> float:
    """Variance inflation from clustering: (video-bootstrap SE / binomial SE)², at least 1.

    Multiply a sample size computed for independent frames by this to get frames from real videos.
    """
    p = proportion.value
    binomial_var = p * (1 - p) / proportion.n
    if binomial_var <= 0 or not math.isfinite(bootstrap.standard_error):
        return 1.0
    return max(1.0, bootstrap.standard_error**2 / binomial_var)


# --- McNemar ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class McNemarResult:
    """Exact McNemar test on the discordant frames and which way they lean.

    `reference_only` (b): flagged with thinking on only; `candidate_only` (c): with thinking off only.
    """

    reference_only: int
    candidate_only: int
    p_value: float
    direction: Direction

    @property
    def discordant(self) -> int:
        return self.reference_only + self.candidate_only

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_value < alpha


def mcnemar_exact(reference: ArrayLike, candidate: ArrayLike) -> McNemarResult:
    """McNemar's exact (binomial) test via statsmodels, two-sided, with the direction of the shift.

    It treats frames as independent; when frames cluster in videos the p-value is optimistic, which is
    why the report pairs it with the video-bootstrap interval of the flag-rate difference.
    """
    ref, cand = _paired(reference, candidate)
    ref_b, cand_b = ref.astype(bool), cand.astype(bool)
    return mcnemar_from_table(
        both=int(np.sum(ref_b & cand_b)),
        reference_only=int(np.sum(ref_b & ~cand_b)),
        candidate_only=int(np.sum(~ref_b & cand_b)),
        neither=int(np.sum(~ref_b & ~cand_b)),
    )


def mcnemar_from_table(*, both: int, reference_only: int, candidate_only: int, neither: int) -> McNemarResult:
    """`mcnemar_exact` from the 2x2 table's counts."""
    b, c = reference_only, candidate_only
    # No discordant frames: nothing to test, and statsmodels' binomial on n=0 is undefined.
    p_value = 1.0 if b + c == 0 else float(mcnemar([[both, b], [c, neither]], exact=True).pvalue)
    direction: Direction
    if c > b:
        direction = "thinking_off flags more"
    elif b > c:
        direction = "thinking_off flags less"
    else:
        direction = "thinking_off flags the same"
    return McNemarResult(reference_only=b, candidate_only=c, p_value=p_value, direction=direction)


# --- against human labels --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClassificationScores:
    """An arm's flagged decisions scored against human labels (flagged = positive)."""

    accuracy: Proportion
    precision: Proportion | None
    recall: Proportion | None


def classification_scores(
    truth: Sequence[bool] | NDArray[np.bool_],
    predicted: Sequence[bool] | NDArray[np.bool_],
    confidence: float = 0.95,
) -> ClassificationScores:
    """Accuracy, precision and recall from scikit-learn's confusion matrix, each with a Wilson interval.

    Precision is undefined when the arm flagged nothing, recall when humans flagged nothing: those
    come back as None rather than sklearn's zero.
    """
    y_true = np.asarray(truth, dtype=np.bool_)
    y_pred = np.asarray(predicted, dtype=np.bool_)
    if y_true.shape != y_pred.shape or y_true.size == 0:
        raise ValueError("truth and predicted must be non-empty and of equal length")
    from sklearn.metrics import confusion_matrix  # imported here: see cohen_kappa

    tn, fp, fn, tp = (int(v) for v in confusion_matrix(y_true, y_pred, labels=[False, True]).ravel())
    accuracy = wilson_interval(tp + tn, y_true.size, confidence)
    precision = wilson_interval(tp, tp + fp, confidence) if tp + fp else None
    recall = wilson_interval(tp, tp + fn, confidence) if tp + fn else None
    return ClassificationScores(accuracy=accuracy, precision=precision, recall=recall)


# --- sample size ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SampleSize:
    """Frames needed to detect agreement falling from `baseline` to `baseline - drop`."""

    baseline: float
    drop: float
    alpha: float
    power: float
    design: Literal["one_sample", "two_sample"]
    effect_size_h: float
    frames: int


def sample_size_for_drop(
    p0: float,
    drop: float,
    alpha: float = 0.05,
    power: float = 0.8,
    design: Literal["one_sample", "two_sample"] = "one_sample",
    *,
    two_sided: bool = False,
) -> SampleSize:
    """Frames needed to detect a drop in agreement from `p0`, one-sided at `alpha` with `power`.

    Cohen's h (arcsine effect size, `proportion_effectsize`) with statsmodels' `NormalIndPower`.
    One-sample by default (`ratio=0`): a week's agreement is tested against a fixed level (the policy
    threshold or the long-run rate), not against another noisy sample. The arcsine scale stabilises
    the variance, which matters near 100 % where the plain normal formula is poor. `two_sample`
    (week against week) gives the frames needed in *each* week, about twice as many. One-sided by
    default: only a drop matters; `two_sided` is there to compare with two-sided power tables.
    The count assumes independent frames: multiply by `design_effect` for frames drawn from videos.
    """
    if not 0 < p0 <= 1 or not 0 < drop < p0:
        raise ValueError("need 0 < drop < p0 <= 1")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("alpha and power must lie strictly between 0 and 1")
    h = float(proportion_effectsize(p0, p0 - drop))
    ratio = 0.0 if design == "one_sample" else 1.0
    solved = NormalIndPower().solve_power(
        effect_size=h,
        alpha=alpha,
        power=power,
        ratio=ratio,
        alternative="two-sided" if two_sided else "larger",
    )
    n = float(solved)
    return SampleSize(
        baseline=p0, drop=drop, alpha=alpha, power=power, design=design, effect_size_h=h, frames=math.ceil(n)
    )
