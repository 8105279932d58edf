"""What the report's sections compute from, and the video bootstrap run over grouped counts in chunks.

:class:`PairCounts` is one pairing as counts per video (never per frame): the 2x2 cells of every video,
every category and every tenant's videos, the action table and the human labels' table. The weekly report
gets it from SQL (`quality.weekly_sql.WeekQueries.pair_counts`), so its memory follows the videos, not the
pairs. :class:`ThresholdFrames` is the one per-frame part, the escalation section's (its AUROC ranks every
frame's confidence): five narrow columns. Both can also be built from :class:`PairColumns`, one entry per
paired frame, for small callers with `PairedRecord` objects in hand; a test holds the two ways equal.

:func:`run_bootstrap` draws the resampling weights once per number of videos, a slice of resamples at a
time (the same draws, in the same order, as drawing them all at once), and hands each slice to every
:class:`ResampleConsumer` of that size: a week's comparison and all its categories share one set of draws,
and memory holds one slice of weights, never resamples × videos.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from contracts.records import PairedRecord
from shaping.verdict import ACTIONS

__all__ = [
    "PairColumns",
    "PairCounts",
    "ResampleConsumer",
    "TenantCounts",
    "ThresholdFrames",
    "first_appearance_codes",
    "inverse_probability_weights",
    "run_bootstrap",
    "unit_weights",
    "video_cells",
]

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
FloatArray = NDArray[np.float64]
# weights held at once per group: rows × videos, as int64 and as float64, about 16 MB each (5 million
# cells made the two workers' weights 160 MB of the 250,000-pair week's 500 MB peak; the draws and the
# products, not the slicing, are the bootstrap's CPU, so smaller slices cost nothing measurable)
_WEIGHT_CELLS = 2_000_000
_WORKERS = min(2, os.cpu_count() or 1)


def first_appearance_codes(keys: IntArray) -> IntArray:
    """0, 1, 2, … in the order each key first appears (what a dict of codes built in a loop gives)."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return np.asarray(rank[inverse], dtype=np.int64)


def _codes(values: pa.ChunkedArray | pa.Array) -> tuple[IntArray, list[str | None]]:
    """Dictionary codes of a string column (nulls get -1) and the dictionary."""
    encoded = pc.dictionary_encode(values)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    if not chunks:
        return np.zeros(0, dtype=np.int64), []
    combined = pa.chunked_array(chunks).unify_dictionaries() if len(chunks) > 1 else pa.chunked_array(chunks)
    dictionary = combined.chunk(0).dictionary.to_pylist() if combined.num_chunks else []
    codes = (
        np.concatenate(
            [
                np.asarray(c.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
                for c in combined.chunks
            ]
        )
        if combined.num_chunks
        else np.zeros(0, dtype=np.int64)
    )
    return codes, dictionary


@dataclass(frozen=True)
class PairColumns:
    """Paired frames of a reference and a candidate arm, column by column, in pairing order."""

    reference: str
    candidate: str
    ref_flagged: BoolArray
    cand_flagged: BoolArray
    ref_action: IntArray  # index into ACTIONS
    cand_action: IntArray
    video: IntArray  # cluster code by first appearance; a frame without a video is its own cluster
    tenant: IntArray  # index into tenants, by first appearance
    tenants: list[str]
    label: NDArray[np.int8]  # human label flagged: 1, 0, or -1 for none
    ref_categories: pa.ListArray
    cand_categories: pa.ListArray
    confidence: FloatArray  # the candidate's, NaN where absent
    escalation: BoolArray  # the candidate was chosen because it escalated
    probability: FloatArray  # the candidate's selection probability, NaN where absent

    def __len__(self) -> int:
        return int(self.ref_flagged.size)

    @property
    def n_videos(self) -> int:
        return int(self.video.max(initial=-1)) + 1

    def take(self, rows: IntArray) -> PairColumns:
        """The pairs at `rows`, in that order, with video codes renumbered by first appearance."""
        indices = pa.array(rows, pa.int64())
        tenant_codes = first_appearance_codes(self.tenant[rows])
        tenants = [
            self.tenants[int(t)] for t in self.tenant[rows][np.unique(tenant_codes, return_index=True)[1]]
        ]
        return PairColumns(
            reference=self.reference,
            candidate=self.candidate,
            ref_flagged=self.ref_flagged[rows],
            cand_flagged=self.cand_flagged[rows],
            ref_action=self.ref_action[rows],
            cand_action=self.cand_action[rows],
            video=first_appearance_codes(self.video[rows]),
            tenant=tenant_codes,
            tenants=tenants,
            label=self.label[rows],
            ref_categories=self.ref_categories.take(indices),
            cand_categories=self.cand_categories.take(indices),
            confidence=self.confidence[rows],
            escalation=self.escalation[rows],
            probability=self.probability[rows],
        )

    def category_members(self, side: str) -> tuple[IntArray, list[str]]:
        """(pair index, category code) for every category a side named, and the category names."""
        lists = self.ref_categories if side == "reference" else self.cand_categories
        parents = np.asarray(pc.list_parent_indices(lists).to_numpy(), dtype=np.int64)
        names, dictionary = _codes(pc.list_flatten(lists))
        return np.stack([parents, names], axis=1) if parents.size else np.zeros((0, 2), np.int64), [
            str(d) for d in dictionary
        ]

    @classmethod
    def from_table(cls, table: pa.Table, reference: str, candidate: str) -> PairColumns:
        """From the SQL stage's pairs (see `quality.weekly_sql.WeekQueries.pairs`)."""
        n = table.num_rows
        action_index = pa.array(list(ACTIONS))

        def actions(name: str) -> IntArray:
            return np.asarray(
                pc.index_in(table.column(name), action_index).to_numpy(zero_copy_only=False), np.int64
            )

        def floats(name: str) -> FloatArray:
            return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

        video_codes, _ = _codes(table.column("video_id"))
        keys = np.where(video_codes >= 0, video_codes, -1 - np.arange(n, dtype=np.int64))
        tenant_codes, tenant_names = _codes(table.column("tenant"))
        tenant_order = first_appearance_codes(tenant_codes)
        order = tenant_codes[np.unique(tenant_order, return_index=True)[1]] if n else np.zeros(0, np.int64)
        label = pc.fill_null(pc.cast(table.column("label_flagged"), pa.int8()), -1)
        return cls(
            reference=reference,
            candidate=candidate,
            ref_flagged=np.asarray(table.column("ref_flagged").to_numpy(zero_copy_only=False), np.bool_),
            cand_flagged=np.asarray(table.column("cand_flagged").to_numpy(zero_copy_only=False), np.bool_),
            ref_action=actions("ref_action"),
            cand_action=actions("cand_action"),
            video=first_appearance_codes(keys),
            tenant=tenant_order,
            tenants=[str(tenant_names[int(t)]) for t in order],
            label=np.asarray(label.to_numpy(zero_copy_only=False), dtype=np.int8),
            ref_categories=_list_column(table, "ref_categories"),
            cand_categories=_list_column(table, "cand_categories"),
            confidence=floats("cand_confidence"),
            escalation=np.asarray(
                pc.fill_null(pc.equal(table.column("cand_selection"), "escalation"), False).to_numpy(
                    zero_copy_only=False
                ),
                np.bool_,
            ),
            probability=floats("cand_selection_probability"),
        )

    @classmethod
    def from_pairs(cls, pairs: Sequence[PairedRecord]) -> PairColumns:
        """From `PairedRecord` objects (tests, benchmarks and callers with a few pairs in hand)."""
        rows = [
            {
                "ref_flagged": p.reference.flagged,
                "cand_flagged": p.candidate.flagged,
                "ref_action": p.reference.action,
                "cand_action": p.candidate.action,
                "ref_categories": list(p.reference.categories),
                "cand_categories": list(p.candidate.categories),
                "video_id": p.video_id,
                "tenant": p.tenant,
                "label_flagged": p.human_label.flagged if p.human_label is not None else None,
                "cand_confidence": p.candidate.confidence,
                "cand_selection": p.candidate.selection,
                "cand_selection_probability": p.candidate.selection_probability,
            }
            for p in pairs
        ]
        table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
        reference = pairs[0].reference.arm if pairs else "thinking_on"
        candidate = pairs[0].candidate.arm if pairs else "thinking_off"
        return cls.from_table(table, reference, candidate)


PAIR_SCHEMA = pa.schema(
    [
        ("ref_flagged", pa.bool_()),
        ("cand_flagged", pa.bool_()),
        ("ref_action", pa.string()),
        ("cand_action", pa.string()),
        ("ref_categories", pa.list_(pa.string())),
        ("cand_categories", pa.list_(pa.string())),
        ("video_id", pa.string()),
        ("tenant", pa.string()),
        ("label_flagged", pa.bool_()),
        ("cand_confidence", pa.float64()),
        ("cand_selection", pa.string()),
        ("cand_selection_probability", pa.float64()),
    ]
)


def _list_column(table: pa.Table, name: str) -> pa.ListArray:
    column = table.column(name).combine_chunks() if table.num_rows else pa.array([], pa.list_(pa.string()))
    if isinstance(column, pa.ChunkedArray):  # an empty table keeps no chunk
        column = pa.array([], pa.list_(pa.string()))
    return column.fill_null(pa.scalar([], pa.list_(pa.string())))


def video_cells(video: IntArray, n_videos: int, reference: BoolArray, candidate: BoolArray) -> IntArray:
    """(videos, 4) counts per video: both_flagged, reference_only, candidate_only, both_safe."""
    cell = np.where(reference, np.where(candidate, 0, 1), np.where(candidate, 2, 3))
    counts = np.bincount(video * 4 + cell, minlength=4 * n_videos)
    return np.asarray(counts.reshape(n_videos, 4), dtype=np.int64)


@dataclass(frozen=True)
class TenantCounts:
    tenant: str
    frames: int
    cells: IntArray  # (the tenant's videos, 4), its videos numbered by first appearance among its pairs


@dataclass(frozen=True)
class PairCounts:
    """One pairing (a reference arm against a candidate arm) as counts: what every section but the
    escalation threshold needs. Videos are numbered by first appearance in pairing order (a frame without
    a video is a video of its own), the order the bootstrap draws them in."""

    reference: str
    candidate: str
    frames: int
    cells: IntArray  # (videos, 4): both_flagged, reference_only, candidate_only, both_safe
    actions: IntArray  # (3, 3): reference action × candidate action, in ACTIONS order
    categories: dict[str, IntArray]  # each category either side named, sorted: (videos, 4) as `cells`
    tenants: list[TenantCounts]  # largest first, ties by first appearance
    labelled: IntArray  # (2, 2, 2): human label flagged × reference flagged × candidate flagged

    def __len__(self) -> int:
        return self.frames

    @property
    def n_videos(self) -> int:
        return int(self.cells.shape[0])

    @classmethod
    def from_columns(cls, pairs: PairColumns) -> PairCounts:
        n_videos = pairs.n_videos
        cells = video_cells(pairs.video, n_videos, pairs.ref_flagged, pairs.cand_flagged)
        action_cell = pairs.ref_action * len(ACTIONS) + pairs.cand_action
        actions = np.bincount(action_cell, minlength=len(ACTIONS) ** 2)
        categories = {}
        for name, (in_reference, in_candidate) in _members(pairs).items():
            reference = np.zeros(len(pairs), dtype=np.bool_)
            candidate = np.zeros(len(pairs), dtype=np.bool_)
            reference[in_reference] = True
            candidate[in_candidate] = True
            categories[name] = video_cells(pairs.video, n_videos, reference, candidate)
        tenants = []
        sizes = np.bincount(pairs.tenant, minlength=len(pairs.tenants))
        for code in sorted(range(len(pairs.tenants)), key=lambda t: -int(sizes[t])):
            group = pairs.take(np.flatnonzero(pairs.tenant == code))
            group_cells = video_cells(group.video, group.n_videos, group.ref_flagged, group.cand_flagged)
            tenants.append(TenantCounts(pairs.tenants[code], len(group), group_cells))
        labelled = pairs.label >= 0
        keys = (pairs.label[labelled].astype(np.int64) * 2 + pairs.ref_flagged[labelled]) * 2
        keys = keys + pairs.cand_flagged[labelled]
        return cls(
            reference=pairs.reference,
            candidate=pairs.candidate,
            frames=len(pairs),
            cells=cells,
            actions=np.asarray(actions.reshape(len(ACTIONS), len(ACTIONS)), dtype=np.int64),
            categories=categories,
            tenants=tenants,
            labelled=np.asarray(np.bincount(keys, minlength=8).reshape(2, 2, 2), dtype=np.int64),
        )


def _members(pairs: PairColumns) -> dict[str, tuple[IntArray, IntArray]]:
    """Per category named on either side: the pairs whose reference named it, and whose candidate did."""
    sides = [pairs.category_members(side) for side in ("reference", "candidate")]
    found: dict[str, tuple[IntArray, IntArray]] = {}
    for name in sorted({name for _, names in sides for name in names}):
        chosen = []
        for members, names in sides:
            code = names.index(name) if name in names else -1
            chosen.append(
                np.unique(members[members[:, 1] == code, 0]) if code >= 0 else np.zeros(0, np.int64)
            )
        found[name] = (chosen[0], chosen[1])
    return found


@dataclass(frozen=True)
class ThresholdFrames:
    """The escalation section's sample, a frame each: the fast verdict's confidence, whether it escalates
    at any threshold, whether it disagrees with thinking on, its weight and its video (by first appearance
    in the sample); with how many pairs escalation chose and how many fast verdicts had no confidence."""

    confidence: FloatArray  # NaN where the fast verdict has none
    forced: BoolArray  # escalates at any threshold (review, an always-escalated category, no confidence)
    disagree: BoolArray
    weight: FloatArray
    video: IntArray
    escalation_pairs: int
    without_confidence: int

    @property
    def size(self) -> int:
        return int(self.weight.size)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with unit weights as just their count: the view of one number would otherwise be
        written, and read back, as a float per frame."""
        unit = self.weight.strides == (0,) and bool(self.weight.size) and float(self.weight[0]) == 1.0
        return (
            _threshold_frames,
            (
                self.confidence,
                self.forced,
                self.disagree,
                self.weight.size if unit else self.weight,
                self.video,
                self.escalation_pairs,
                self.without_confidence,
            ),
        )

    @classmethod
    def from_columns(cls, pairs: PairColumns, sample: str, always: Iterable[str]) -> ThresholdFrames:
        """The pairs the estimate may use: those escalation did not choose (`random`), or every pair
        weighted by 1 / its selection probability (`ipw`)."""
        kept = np.flatnonzero(~pairs.escalation) if sample == "random" else np.arange(len(pairs))
        chosen = pairs.take(kept)
        named_always = np.zeros(len(chosen), dtype=np.bool_)
        members, names = chosen.category_members("candidate")
        codes = [names.index(name) for name in always if name in names]
        if codes and members.size:
            named_always[members[np.isin(members[:, 1], codes), 0]] = True
        without_confidence = np.isnan(chosen.confidence)
        forced = (chosen.cand_action == ACTIONS.index("review")) | named_always | without_confidence
        ipw = sample == "ipw"
        return cls(
            confidence=chosen.confidence,
            forced=np.asarray(forced, dtype=np.bool_),
            disagree=_disagree(chosen),
            weight=inverse_probability_weights(chosen.probability) if ipw else unit_weights(len(chosen)),
            video=chosen.video,
            escalation_pairs=int(pairs.escalation.sum()),
            without_confidence=int(without_confidence.sum()),
        )


def _threshold_frames(
    confidence: FloatArray,
    forced: BoolArray,
    disagree: BoolArray,
    weight: FloatArray | int,
    video: IntArray,
    escalation_pairs: int,
    without_confidence: int,
) -> ThresholdFrames:
    """`ThresholdFrames` from its pickle (`weight` a count for unit weights)."""
    weights = unit_weights(weight) if isinstance(weight, int) else weight
    return ThresholdFrames(confidence, forced, disagree, weights, video, escalation_pairs, without_confidence)


def unit_weights(size: int) -> FloatArray:
    """A weight of 1 for each of `size` frames, as a read-only view of one number (no memory per frame)."""
    return np.broadcast_to(np.float64(1.0), (size,))


def inverse_probability_weights(probability: FloatArray) -> FloatArray:
    """1 / the chance a pair had of being paired; 1 where that chance is unknown (or zero)."""
    weight = np.ones(probability.size)
    known = np.isfinite(probability) & (probability != 0)
    weight[known] = 1.0 / probability[known]
    return weight


def _disagree(pairs: PairColumns) -> BoolArray:
    """Whether each pair's fast verdict differs from thinking on's (`quality.escalation.same_verdict`):
    another action, or a block naming other categories."""
    disagree = pairs.ref_action != pairs.cand_action
    blocks = np.flatnonzero(~disagree & (pairs.cand_action == ACTIONS.index("block")))
    if blocks.size:
        indices = pa.array(blocks, pa.int64())
        fast = pairs.cand_categories.take(indices).to_pylist()
        thinking = pairs.ref_categories.take(indices).to_pylist()
        disagree[blocks] = [set(f or ()) != set(t or ()) for f, t in zip(fast, thinking, strict=True)]
    return np.asarray(disagree, dtype=np.bool_)


class ResampleConsumer(Protocol):
    """Takes the video bootstrap's weights a slice of resamples at a time: rows `start` … of (resamples,
    videos) counts of each video drawn (as float64, exact: they are small integers); the same rows it
    would see in one (resamples, videos) matrix."""

    def feed(self, start: int, weights: FloatArray) -> None: ...


def run_bootstrap(
    groups: Iterable[tuple[int, int, int, ResampleConsumer]], *, cells: int = _WEIGHT_CELLS
) -> None:
    """For each (videos, resamples, seed) draw the weights once and feed every consumer of it.

    Drawing videos with replacement: a resample is `videos` indices drawn uniformly, and a video's weight
    the number of times it was drawn (a Multinomial(videos, 1/videos) row, counted with `bincount`, which
    is an eighth of numpy's `multinomial` time at 15,000 videos and a tenth at 150,000). Each row is one
    call of the generator, so slices give exactly the rows of one run without slices (a test holds this).
    """
    by_key: dict[tuple[int, int, int], list[ResampleConsumer]] = defaultdict(list)
    for videos, resamples, seed, consumer in groups:
        by_key[(videos, resamples, seed)].append(consumer)

    def draw(key: tuple[int, int, int]) -> None:
        videos, resamples, seed = key
        rng = np.random.default_rng(seed)
        step = max(1, min(resamples, cells // max(videos, 1)))
        for start in range(0, resamples, step):
            weights = np.empty((min(step, resamples - start), videos), dtype=np.float64)
            for row in weights:
                row[:] = np.bincount(rng.integers(0, videos, size=videos, dtype=np.int32), minlength=videos)
            for consumer in by_key[key]:
                consumer.feed(start, weights)

    # Each group has its own generator, so groups may draw side by side: numpy releases the GIL while
    # it draws and multiplies, and the draws of a group do not depend on the others.
    keys = sorted(by_key, key=lambda k: -k[0] * k[1])
    workers = min(len(keys), _WORKERS)
    # One BLAS thread per worker: the products are (slice × videos) @ (videos × a few columns), which
    # threaded OpenBLAS runs ten times slower on a busy two-core machine (its threads spin for a core).
    with threadpool_limits(limits=1, user_api="blas"):
        if workers <= 1:
            for key in keys:
                draw(key)
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bootstrap") as pool:
            for future in [pool.submit(draw, key) for key in keys]:
                future.result()
