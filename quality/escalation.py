"""The escalation rule and how to pick its threshold from an unbiased sample of thinking on/off pairs.

A keyframe is judged fast (thinking off) first and asked again with thinking on when the fast verdict is
unsure: its action is ``review``, its confidence (the engine's probability of that action) is below a
threshold, or it names a category the policy always escalates. :func:`escalation_reason` is that rule,
for the gateway and for this module alike.

Which threshold? Escalated frames answer with thinking on, so at a threshold ``t`` the answer agrees with
thinking on on every escalated frame and, on the others, wherever the fast verdict already did. Both the
share escalated and that agreement are means over *all* live frames, so they must be estimated from a
sample that represents all of them: the random shadow pairs (each records the fast verdict's confidence),
or every pair weighted by the inverse of its chance of having been paired (escalated frames are always
paired, the others only by the shadow share). Escalation pairs on their own are the unsure frames only
and would make thinking off look far worse than it is.

Intervals resample whole videos (frames of one video are correlated) and are joined with a Wilson
interval on the Kish effective sample size, as elsewhere in the report. Plain CPU work: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import sparse

from contracts.escalation_rule import ESCALATION_REASONS, EscalationReason, escalation_reason
from contracts.records import PairedRecord
from contracts.summaries import EscalationSample, Estimate, ThresholdRow, ThresholdSection
from quality.columns import IntArray, PairColumns, ThresholdFrames, run_bootstrap
from quality.stats import wilson_interval

Ranks = NDArray[np.signedinteger[Any]]  # a level per frame (int32 or int64)

__all__ = [
    "ESCALATION_REASONS",
    "EscalationReason",
    "EscalationSample",
    "Estimate",
    "ThresholdPlan",
    "ThresholdRow",
    "ThresholdSection",
    "escalation_reason",
    "same_verdict",
    "threshold_section",
    "weighted_auroc",
]

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
_EMPTY, _NO, _NONE = np.zeros(0), np.zeros(0, np.bool_), np.zeros(0, np.int64)


def same_verdict(
    action: str, categories: Collection[str], other_action: str, other_categories: Collection[str]
) -> bool:
    """Two verdicts agree when the action is the same and, for a block, so are the categories."""
    if action != other_action:
        return False
    return action != "block" or set(categories) == set(other_categories)


def _escalated(frames: ThresholdFrames, thresholds: FloatArray) -> BoolArray:
    """(frames, thresholds): which frames escalate at each threshold."""
    below = np.nan_to_num(frames.confidence, nan=-1.0)[:, None] < thresholds[None, :]
    everything = (thresholds >= 1)[None, :]  # as escalation_reason: a threshold of 1 escalates every frame
    return np.asarray(frames.forced[:, None] | below | everything, dtype=np.bool_)


def weighted_auroc(
    score: FloatArray, positive: BoolArray, weights: FloatArray, rank: tuple[Ranks, int] | None = None
) -> FloatArray:
    """AUROC of ``score`` for ``positive`` under each row of ``weights`` (resamples × frames); ties count ½.

    The weighted Mann-Whitney statistic: the chance that a positive frame scores above a negative one.
    NaN for a row whose weights leave one class empty. ``rank``: the scores' ranks and level count, when
    the caller computes them once for many calls.
    """
    if rank is None:
        values, ranks = np.unique(score, return_inverse=True)
        rank = (np.asarray(ranks, dtype=np.int64), int(values.size))
    ranks, levels = rank
    weights = np.atleast_2d(weights)
    pos = np.stack([np.bincount(ranks, w * positive, minlength=levels) for w in weights])
    neg = np.stack([np.bincount(ranks, w * ~positive, minlength=levels) for w in weights])
    below = np.cumsum(neg, axis=1) - neg  # negative weight strictly below each level
    wins = np.sum(pos * (below + 0.5 * neg), axis=1)
    total = pos.sum(axis=1) * neg.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(total > 0, wins / total, np.nan), dtype=np.float64)


def _estimate(
    value: float, boot: FloatArray, weight: tuple[float, float], confidence: float, *, wilson: bool = True
) -> Estimate:
    """The point value with the union of its bootstrap percentile and Wilson (effective n) intervals."""
    tail = (1 - confidence) / 2
    finite = boot[np.isfinite(boot)]
    low, high = (
        (value, value)
        if finite.size == 0
        else (float(np.quantile(finite, tail)), float(np.quantile(finite, 1 - tail)))
    )
    if wilson:
        total, squares = weight  # the weights' sum and sum of squares: Kish's effective size
        n_eff = float(total**2 / squares)
        n = max(1, round(n_eff))
        k = min(n, max(0, round(value * n)))
        interval = wilson_interval(k, n, confidence)
        low, high = min(low, interval.low), max(high, interval.high)
    return Estimate(value=value, low=max(0.0, min(low, value)), high=min(1.0, max(high, value)))


def _dense_ranks(score: FloatArray) -> tuple[Ranks, int, IntArray]:
    """Each score's level among the distinct scores, 0 for the lowest (what `np.unique(score,
    return_inverse=True)` gives, as int32), how many levels there are, and the frames from the lowest
    score up, ties in frame order: one stable sort, with well under `np.unique`'s memory (it holds
    several int64 arrays a frame at once: 400 MB at ten million frames)."""
    by_score = np.argsort(score, kind="stable")
    ordered = score[by_score]
    starts = np.empty(ordered.size, dtype=np.bool_)
    starts[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    del ordered
    level = np.cumsum(starts, dtype=np.int32)
    del starts
    level -= 1
    ranks = np.empty(score.size, dtype=np.int32)
    ranks[by_score] = level
    return ranks, int(level[-1]) + 1 if level.size else 0, np.asarray(by_score, dtype=np.int64)


def default_thresholds(confidence: FloatArray) -> FloatArray:
    """A fixed grid, plus the confidences that escalate 1 %, 2 %, …, 40 % of the sample."""
    grid = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99]
    known = confidence[np.isfinite(confidence)]
    if known.size:
        grid += [round(float(q), 3) for q in np.quantile(known, np.linspace(0.01, 0.40, 40))]
    return np.asarray(sorted({t for t in grid if 0 < t <= 1}), dtype=np.float64)


def _pct(value: float) -> str:
    return f"{value * 100:.1f} %"


def _recommend(rows: list[ThresholdRow], target: float) -> tuple[ThresholdRow | None, str]:
    """The lowest threshold whose agreement interval clears the target (else whose estimate reaches it)."""

    def line(row: ThresholdRow) -> str:
        return (
            f"escalate below {row.threshold:.3g}: {row.escalated.value * 100:.0f} % escalated, agreement "
            f"{_pct(row.agreement.value)} [{row.agreement.low * 100:.1f}, {row.agreement.high * 100:.1f}]"
        )

    cleared = [row for row in rows if row.agreement.low >= target]
    if cleared:
        return cleared[0], line(cleared[0]) + f" (the interval clears {_pct(target)})."
    reached = [row for row in rows if row.agreement.value >= target]
    if reached:
        return reached[0], (
            line(reached[0]) + f"; the interval does not yet clear {_pct(target)}: more random pairs "
            "would settle it."
        )
    if not rows:
        return None, "No thresholds to judge."
    best = rows[-1]
    return None, (
        f"No threshold up to {best.threshold:.3g} reaches {_pct(target)} agreement ({line(best)}): "
        "keep thinking on, or escalate more categories."
    )


def threshold_section(
    pairs: Sequence[PairedRecord],
    *,
    sample: EscalationSample = "random",
    always: Collection[str] = ("sexual/minors",),
    target: float = 0.99,
    thresholds: Sequence[float] | None = None,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> ThresholdSection | None:
    """Agreement with thinking on against the share escalated, per threshold; None without usable pairs.

    ``pairs``: thinking on as reference, thinking off (the fast verdict, with its confidence) as
    candidate. ``sample="random"`` uses only pairs not chosen by escalation (random shadow pairs and
    offline runs), unweighted; ``"ipw"`` uses every pair weighted by 1 / its ``selection_probability``.
    """
    if not pairs:
        return None
    plan = ThresholdPlan(
        ThresholdFrames.from_columns(PairColumns.from_pairs(pairs), sample, always),
        sample=sample,
        always=always,
        target=target,
        thresholds=thresholds,
        resamples=resamples,
        confidence=confidence,
        seed=seed,
    )
    run_bootstrap(plan.groups())
    return plan.result()


# AUROC resamples: the first 400 draws (frame-level weights cost frames × resamples)
_AUROC_RESAMPLES = 400
_FRAME_CELLS = 4_000_000


class ThresholdPlan:
    """The threshold section over paired columns, in two steps like the report's other sections: its
    bootstrap goes to `quality.columns.run_bootstrap` (`groups()`), then `result()`.

    Per video, weighted sums of: frames, escalated frames per threshold, agreeing frames per threshold,
    and disagreeing frames; each resample is draws @ those sums (with whole weights, taken from sparse
    per-threshold bins, so memory follows the frames rather than videos × thresholds). Frame-level
    weights are built only for the AUROC, a few resamples at a time.
    """

    def __init__(
        self,
        frames: ThresholdFrames,
        *,
        sample: EscalationSample = "random",
        always: Collection[str] = ("sexual/minors",),
        target: float = 0.99,
        thresholds: Sequence[float] | None = None,
        resamples: int = 1000,
        confidence: float = 0.95,
        seed: int = 0,
    ) -> None:
        self.sample, self.always, self.target = sample, set(always), target
        self.resamples, self.confidence, self.seed = resamples, confidence, seed
        self.escalation_pairs, self.without = frames.escalation_pairs, frames.without_confidence
        self.frames = frames
        self._empty = frames.size == 0
        if self._empty:
            return
        self.grid = (
            np.asarray(sorted(set(thresholds)), dtype=np.float64)
            if thresholds is not None
            else default_thresholds(frames.confidence)
        )
        w, t = frames.weight, self.grid.size
        cluster = frames.video
        self.n_videos = int(cluster.max()) + 1
        confidence_or_low = np.nan_to_num(frames.confidence, nan=-1.0)
        # whole weights (every sample but inverse-probability ones): every sum below is a whole number far
        # below 2**53, exact in any order, so sums may be taken by threshold bin and by score segment
        # instead of frame by frame and come out the same bits
        self.whole = bool(np.all(w == np.round(w)))
        self.recovered: list[float | None] = []
        disagree_weight = float(np.sum(w * frames.disagree))
        per_video = None if self.whole else np.zeros((self.n_videos, 1 + 2 * t + 1))
        for column, threshold in enumerate(self.grid):
            escalated = frames.forced | (confidence_or_low < threshold) | bool(threshold >= 1)
            if per_video is not None:
                agree = escalated | ~frames.disagree
                per_video[:, 1 + column] = np.bincount(cluster, w * escalated, minlength=self.n_videos)
                per_video[:, 1 + t + column] = np.bincount(cluster, w * agree, minlength=self.n_videos)
            self.recovered.append(
                float(np.sum(w * (frames.disagree & escalated))) / disagree_weight
                if disagree_weight > 0
                else None
            )
        if per_video is not None:
            per_video[:, 0] = np.bincount(cluster, w, minlength=self.n_videos)
            per_video[:, -1] = np.bincount(cluster, w * frames.disagree, minlength=self.n_videos)
        else:
            self._prepare_bins(confidence_or_low)
        self.per_video, self.disagree_weight = per_video, disagree_weight
        self.resampled: list[FloatArray] = []
        self.auroc_boot: list[FloatArray] = []
        self.with_auroc = bool(frames.disagree.any() and not frames.disagree.all())
        if self.with_auroc:
            # lower confidence: likelier to disagree (negated in place: the thresholds are done with it)
            self.score = np.negative(confidence_or_low, out=confidence_or_low)
            del confidence_or_low
            ranks, levels, by_score = _dense_ranks(self.score)
            self.rank = (ranks, levels)
            if self.whole:
                # a frame each, none of them needed once the segments are built: held only by the plan,
                # which lets go of each as soon as it can (a third of a gigabyte at ten million pairs)
                del self.score, ranks
                self._by_score = by_score
                del by_score
                self._prepare_fast_auroc()
                # the point value from the segments too, as one resample of every video once: the same
                # whole-number sums as `weighted_auroc` frame by frame, so the same bits, without its
                # arrays of a float per distinct score (half a gigabyte at ten million pairs)
                self.point_auroc = float(self._fast_auroc(np.ones((1, self.n_videos)))[0])
            else:
                del ranks, by_score
                self.point_auroc = float(
                    weighted_auroc(self.score, frames.disagree, w[None, :], self.rank)[0]
                )
        self.weight_sums = (float(w.sum()), float(np.sum(w**2)))
        self.size = frames.size
        if self.whole:
            # the sample's frames are all in the bins, the per-video sums and the segments now: let go
            # of them (at ten million pairs they are half the report's memory)
            self.frames = replace(
                frames, confidence=_EMPTY, forced=_NO, disagree=_NO, weight=_EMPTY, video=_NONE
            )

    def _prepare_bins(self, confidence_or_low: FloatArray) -> None:
        """Per video, the weight of frames first escalated at each threshold, as sparse (thresholds,
        videos) matrices (all frames, and those that disagree), plus five per-video sums: a video's
        escalated weight at a threshold is then its forced weight plus a cumulative sum over bins. Memory
        follows the frames that fall in a bin, not videos × thresholds."""
        frames, t, n = self.frames, self.grid.size, self.n_videos
        w, video, forced, disagree = frames.weight, frames.video, frames.forced, frames.disagree
        # the first threshold a frame's confidence is below: it escalates there and at every one above;
        # a forced frame escalates everywhere (it is in the per-video sums, not the bins)
        first = np.searchsorted(self.grid, confidence_or_low, side="right").astype(np.int32)
        binned = ~forced & (first < t)
        rows, columns, weights = first[binned], video[binned].astype(np.int32), w[binned]
        del first
        split = disagree[binned]
        del binned
        self._bins = sparse.csr_matrix((weights, (rows, columns)), shape=(t, n))
        self._disagree_bins = sparse.csr_matrix((weights[split], (rows[split], columns[split])), shape=(t, n))
        del rows, columns, weights, split
        self._base = np.stack(
            [
                np.bincount(video, w, minlength=n),
                np.bincount(video, w * forced, minlength=n),
                np.bincount(video, w * (forced & disagree), minlength=n),
                np.bincount(video, w * ~disagree, minlength=n),
                np.bincount(video, w * disagree, minlength=n),
            ],
            axis=1,
        )
        self._everything = self.grid >= 1  # escalation_reason: a threshold of 1 escalates every frame

    def _sums(self, draws: FloatArray) -> FloatArray:
        """(resamples, 2 + 2 × thresholds): weight, escalated weight per threshold, agreeing weight per
        threshold, disagreeing weight, of each row of video draws."""
        if self.per_video is not None:
            return np.asarray(draws @ self.per_video, dtype=np.float64)
        base = draws @ self._base
        total, forced, forced_disagree, agreeing, disagreeing = (base[:, i : i + 1] for i in range(5))
        transposed = np.ascontiguousarray(draws.T)
        escalated = forced + np.cumsum(np.asarray(self._bins @ transposed).T, axis=1)
        recovered = forced_disagree + np.cumsum(np.asarray(self._disagree_bins @ transposed).T, axis=1)
        agree = agreeing + recovered  # escalated or agreeing already: the two are disjoint
        escalated[:, self._everything] = total
        agree[:, self._everything] = total
        return np.hstack([total, escalated, agree, disagreeing])

    def _prepare_fast_auroc(self) -> None:
        """The negatives' weight per video between consecutive cut points (each positive's score, below
        and at it), as a sparse (segments, videos) matrix: a resample's weight below and at each positive
        is then a cumulative sum over segments, one sparse product per slice of resamples. Takes (and
        lets go of) `self.rank` and `self._by_score`, the frames from the lowest score up, ties in frame
        order (`_dense_ranks`)."""
        ranks, _ = self.rank
        del self.rank
        frames = self.frames
        positive = np.flatnonzero(frames.disagree)
        order = self._by_score[~frames.disagree[self._by_score]]  # the negatives from the lowest score up
        del self._by_score
        negative_ranks = ranks[order]
        positive_ranks = ranks[positive]
        del ranks
        below = np.searchsorted(negative_ranks, positive_ranks, side="left")
        upto = np.searchsorted(negative_ranks, positive_ranks, side="right")
        del negative_ranks, positive_ranks
        cuts = np.unique(np.concatenate([[0, order.size], below, upto]))
        # each negative's segment: k for the negatives between cuts k and k + 1 (the cuts run 0 … size)
        segment = np.repeat(np.arange(cuts.size - 1, dtype=np.int32), np.diff(cuts))
        weights, videos = frames.weight[order], frames.video[order].astype(np.int32)
        del order
        self._segments = sparse.csr_matrix((weights, (segment, videos)), shape=(cuts.size, self.n_videos))
        del weights, videos, segment
        self._below = np.searchsorted(cuts, below)
        self._upto = np.searchsorted(cuts, upto)
        self._pos_video = frames.video[positive]
        self._pos_weight = frames.weight[positive]

    def _fast_auroc(self, draws: FloatArray) -> FloatArray:
        """`weighted_auroc` for whole frame weights. Every weight and sum is a whole number (or a half)
        far below 2**53, so summing by segment instead of frame by frame gives the same bits."""
        pos_weight = draws[:, self._pos_video] * self._pos_weight[None, :]
        by_segment = np.asarray(self._segments @ np.ascontiguousarray(draws.T))  # (segments, resamples)
        cumulative = np.zeros((by_segment.shape[0] + 1, draws.shape[0]))
        np.cumsum(by_segment, axis=0, out=cumulative[1:])
        below = cumulative[self._below].T
        ties = cumulative[self._upto].T - below
        wins = np.sum(pos_weight * (below + 0.5 * ties), axis=1)
        total = pos_weight.sum(axis=1) * cumulative[-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(np.where(total > 0, wins / total, np.nan), dtype=np.float64)

    def groups(self) -> list[tuple[int, int, int, ThresholdPlan]]:
        if self._empty:
            return []
        return [(self.n_videos, self.resamples, self.seed, self)]

    def feed(self, start: int, weights: FloatArray) -> None:
        draws = weights
        self.resampled.append(self._sums(draws))
        auroc_rows = min(self.resamples, _AUROC_RESAMPLES) - start
        if not self.with_auroc or auroc_rows <= 0:
            return
        if self.whole:  # memory per resample: segments and positives, not frames
            self.auroc_boot.append(self._fast_auroc(draws[:auroc_rows]))
            return
        frames = self.frames
        step = max(1, _FRAME_CELLS // max(frames.size, 1))
        for first in range(0, min(auroc_rows, draws.shape[0]), step):
            last = min(first + step, auroc_rows, draws.shape[0])
            frame_draws = draws[first:last, frames.video] * frames.weight[None, :]
            self.auroc_boot.append(weighted_auroc(self.score, frames.disagree, frame_draws, self.rank))

    def result(self) -> ThresholdSection | None:
        if self._empty:
            return None
        w, t, confidence = self.weight_sums, self.grid.size, self.confidence
        resampled = np.vstack(self.resampled)
        observed = (
            self.per_video.sum(axis=0)
            if self.per_video is not None
            else self._sums(np.ones((1, self.n_videos)))[0]
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            boot_escalated = resampled[:, 1 : 1 + t] / resampled[:, :1]
            boot_agree = resampled[:, 1 + t : 1 + 2 * t] / resampled[:, :1]
            boot_disagree = resampled[:, -1] / resampled[:, 0]
        total = observed[0]
        rows = [
            ThresholdRow(
                threshold=float(threshold),
                escalated=_estimate(observed[1 + column] / total, boot_escalated[:, column], w, confidence),
                agreement=_estimate(observed[1 + t + column] / total, boot_agree[:, column], w, confidence),
                recovered=self.recovered[column],
            )
            for column, threshold in enumerate(self.grid)
        ]
        auroc: Estimate | None = None
        if self.with_auroc:
            auroc = _estimate(self.point_auroc, np.concatenate(self.auroc_boot), w, confidence, wilson=False)
        recommended, text = _recommend(rows, self.target)
        return ThresholdSection(
            sample=self.sample,
            pairs=self.size,
            videos=self.n_videos,
            effective_pairs=round(w[0] ** 2 / w[1], 1),
            escalation_pairs=self.escalation_pairs,
            without_confidence=self.without,
            always_escalate=sorted(self.always),
            target_agreement=self.target,
            disagreement=_estimate(self.disagree_weight / total, boot_disagree, w, confidence),
            auroc=auroc,
            rows=rows,
            recommended=recommended,
            recommendation=text[0].upper() + text[1:],
        )
