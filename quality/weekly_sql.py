"""The relational half of the weekly report, as SQL: the week's records, deduplicated, paired, counted.

Everything that touches every record is a query here (DuckDB over Parquet partitions or arrow
batches). Each pairing is joined once into a temporary table, a row per paired frame, and what comes back
is counts: a row per video (its 2x2 cells), per (category, video), per (tenant, video), per action pair.
The one exception is the escalation section's sample, five narrow columns a frame (its AUROC ranks every
confidence). The statistics (:mod:`quality.columns`, :mod:`quality.sections`) only ever see those. The
queries are plain SQL (window functions, joins, group by) with nothing DuckDB-only but `read_parquet` and
a few list functions, so the same text runs as Spark SQL or Trino over the same partitions when a week
outgrows one machine (docs/quality.md says how).

Order is part of the result: a report's video bootstrap draws whole videos in the order they first
appear, as the record-by-record code did, so each pairing numbers its rows by the reference record's time
and then its position in the store (`seq`), videos are coded by their first row, and the numbers are the
same to the last bit.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quality.columnar import RECORD_SCHEMA
from quality.columns import (
    BoolArray,
    IntArray,
    PairCounts,
    TenantCounts,
    ThresholdFrames,
    inverse_probability_weights,
    unit_weights,
)
from shaping.verdict import ACTIONS

__all__ = ["PairQuery", "WeekCounts", "WeekQueries"]

# How much memory DuckDB may hold before it spills to its temporary directory: the report's own ceiling.
MEMORY_LIMIT = "300MB"


@dataclass(frozen=True)
class PairQuery:
    """Which records pair: the two arms, whether escalation-chosen records are left out first, whether
    the candidate's cache hits are dropped, and which engines judged each side."""

    reference: str
    candidate: str
    exclude_escalation: bool = False
    skip_reused_candidates: bool = False
    reference_engine: str | None = "vllm"
    candidate_engine: str | None = "vllm"


@dataclass(frozen=True)
class WeekCounts:
    records: int
    by_arm: dict[str, int]
    by_source: dict[str, int]  # in the order each source first appears
    policy_versions: list[int]
    tenants: int
    engines: list[str]


# what pairing and the pair rows need of a record (not its request id, tokens or timings)
_PAIR_COLUMNS = (
    "frame_sha256, policy_version, recorded_at, seq, arm, reused, flagged, action, categories, video_id, "
    "tenant, human_label, confidence, selection, selection_probability"
)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# an action as its index in ACTIONS (what the numpy side counts with)
_ACTIONS = "[" + ", ".join(_literal(a) for a in ACTIONS) + "]"
_CELL_NAMES = ("both", "ref_only", "cand_only", "both_safe")
_BATCH_ROWS = 1 << 18  # rows of the escalation sample read at a time
_COST_COLUMNS = frozenset(
    ("latency_ms", "ttft_ms", "prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
)
# a pairing's rows meeting `where`, each with its video's code: 0, 1, … by first appearance in pairing
# order (within each `partition`, when given), the order the video bootstrap draws videos in
_CODED = """
    WITH kept AS (SELECT * FROM {table} WHERE {where}),
    codes AS (
        SELECT {keys}, row_number() OVER ({partition}ORDER BY min(struct_pack(pair_at, seq))) - 1 AS video
        FROM kept GROUP BY {keys}
    ),
    coded AS (SELECT kept.*, codes.video FROM kept JOIN codes USING ({keys}))
"""
_CELLS = """
    SELECT {keys},
        count(*) FILTER (WHERE ref_flagged AND cand_flagged) AS both,
        count(*) FILTER (WHERE ref_flagged AND NOT cand_flagged) AS ref_only,
        count(*) FILTER (WHERE NOT ref_flagged AND cand_flagged) AS cand_only,
        count(*) FILTER (WHERE NOT ref_flagged AND NOT cand_flagged) AS both_safe
    FROM coded GROUP BY {keys} ORDER BY {keys}
"""
# per category and video: pairs both sides named it in, the reference only, the candidate only (a
# category named twice on one side counts once)
_CATEGORY_CELLS = """
    , ref AS (SELECT DISTINCT seq, video, unnest(ref_categories) AS category FROM coded),
    cand AS (SELECT DISTINCT seq, video, unnest(cand_categories) AS category FROM coded)
    SELECT coalesce(r.category, c.category) AS category, coalesce(r.video, c.video) AS video,
        count(*) FILTER (WHERE r.seq IS NOT NULL AND c.seq IS NOT NULL) AS both,
        count(*) FILTER (WHERE c.seq IS NULL) AS ref_only,
        count(*) FILTER (WHERE r.seq IS NULL) AS cand_only
    FROM ref r FULL JOIN cand c ON r.seq = c.seq AND r.category = c.category
    WHERE coalesce(r.category, c.category) IS NOT NULL
    GROUP BY ALL ORDER BY 1, 2
"""


def _integers(table: pa.Table, name: str) -> IntArray:
    """A count or code column of a query's arrow result as int64 numpy."""
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


def _rows_named(column: pa.Array, name: str) -> BoolArray:
    """Which rows of an arrow string column of a query's result hold `name`."""
    return np.asarray(pc.equal(column, name).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _coded(table: str, *, where: str = "true", partition: str | None = None) -> str:
    keys = f"{partition}, cluster" if partition else "cluster"
    return _CODED.format(
        table=table, where=where, keys=keys, partition=f"PARTITION BY {partition} " if partition else ""
    )


class WeekQueries:
    """One week's records behind a DuckDB connection, as the view `week` (with its store order `seq`)."""

    def __init__(
        self, connection: duckdb.DuckDBPyConnection, spill: tempfile.TemporaryDirectory[str]
    ) -> None:
        self.db = connection
        self._spill = spill
        # each pairing side ranked so far: condition -> (temporary table, records meeting it, firsts)
        self._side_tables: dict[str, tuple[str, int, int]] = {}
        # each pairing joined so far: query -> (temporary table, what did not pair)
        self._pair_tables: dict[PairQuery, tuple[str, dict[str, int]]] = {}

    @classmethod
    def open(
        cls,
        source: Path | pa.Table | Iterable[pa.RecordBatch],
        start: datetime,
        end: datetime,
        *,
        only_source: str | None = None,
    ) -> WeekQueries:
        """Parquet files under a folder (read where they lie), or arrow data (spilled to a temporary file)."""
        # A database file in a folder of its own, removed on close: the pairing tables (a row per pair)
        # live in it, so DuckDB can write their blocks out and stay inside its memory limit (an in-memory
        # database must hold its tables in memory), and spills past the limit go beside it. No result
        # relies on the order rows are stored in: every ordered one says ORDER BY.
        spill = tempfile.TemporaryDirectory(prefix="modgate-duckdb-")
        db = duckdb.connect(
            str(Path(spill.name) / "week.duckdb"),
            config={
                "memory_limit": MEMORY_LIMIT,
                "preserve_insertion_order": False,
                "temp_directory": str(Path(spill.name) / "spill"),
                # the file is scratch, removed on close: no block of it is ever read back after the run,
                # so it is never checkpointed (closing the 1M-pair week's file wrote its tables out: 2 s)
                "checkpoint_threshold": "1TB",
            },
        )
        db.execute("PRAGMA disable_checkpoint_on_shutdown")
        if isinstance(source, Path):
            files = sorted(str(p) for p in source.rglob("*.parquet"))
            if files:
                listed = ", ".join(_literal(f) for f in files)
                # a record's place in the store: its file's place in the sorted list, then its row in it
                db.execute(
                    f"CREATE VIEW store AS SELECT * EXCLUDE (filename, file_row_number), "
                    f"list_position([{listed}], filename)::BIGINT * 4294967296 + file_row_number AS seq "
                    f"FROM read_parquet([{listed}], filename = true, file_row_number = true, "
                    "union_by_name = true)"
                )
            else:
                db.register("empty_records", RECORD_SCHEMA.empty_table())
                db.execute("CREATE VIEW store AS SELECT *, 0::BIGINT AS seq FROM empty_records")
        else:
            table = source if isinstance(source, pa.Table) else pa.Table.from_batches(source, RECORD_SCHEMA)
            numbered = table.append_column("seq", pa.array(np.arange(table.num_rows, dtype=np.int64)))
            db.register("arrow_records", numbered)
            db.execute("CREATE TABLE store AS SELECT * FROM arrow_records")
            db.unregister("arrow_records")
        low, high = _literal(start.isoformat()), _literal(end.isoformat())
        bounds = f"TIMESTAMPTZ {low} AND recorded_at < TIMESTAMPTZ {high}"
        if only_source is not None:
            bounds += f" AND source = {_literal(only_source)}"
        db.execute(f"CREATE VIEW week AS SELECT * FROM store WHERE recorded_at >= {bounds}")
        return cls(db, spill)

    def close(self) -> None:
        """Close the connection and remove its spill folder (again: nothing)."""
        self.db.close()
        self._spill.cleanup()

    def counts(self) -> WeekCounts:
        by_arm = dict(self.db.execute("SELECT arm, count(*) FROM week GROUP BY arm").fetchall())
        by_source = self.db.execute(
            "SELECT source, count(*) FROM week GROUP BY source ORDER BY min(seq)"
        ).fetchall()
        versions = [
            v for (v,) in self.db.execute("SELECT DISTINCT policy_version FROM week ORDER BY 1").fetchall()
        ]
        tenants, records = self.db.execute("SELECT count(DISTINCT tenant), count(*) FROM week").fetchall()[0]
        engines = [e for (e,) in self.db.execute("SELECT DISTINCT engine FROM week ORDER BY 1").fetchall()]
        return WeekCounts(
            records=int(records),
            by_arm={str(k): int(v) for k, v in by_arm.items()},
            by_source={str(k): int(v) for k, v in by_source},
            policy_versions=[int(v) for v in versions],
            tenants=int(tenants),
            engines=[str(e) for e in engines],
        )

    def _sides(self, query: PairQuery) -> tuple[str, str]:
        """The conditions that make a record the reference side or the candidate side of `query`,
        spelled the same whichever pairing asks, so that pairings sharing a side share its ranking."""

        def arm(name: str, engine: str | None) -> str:
            return f"(arm = {_literal(name)}" + (f" AND engine = {_literal(engine)}" if engine else "") + ")"

        reference = [arm(query.reference, query.reference_engine)]
        candidate = [arm(query.candidate, query.candidate_engine)]
        same_arm = query.reference == query.candidate
        if query.exclude_escalation:
            reference.append("selection IS DISTINCT FROM 'escalation'")
            candidate.append("selection IS DISTINCT FROM 'escalation'")
        if query.skip_reused_candidates:
            candidate.append("NOT reused")
            if same_arm:
                reference.append("NOT reused")
        engines = (query.reference_engine, query.candidate_engine)
        if same_arm and (None in engines or engines[0] == engines[1]):
            # a record that is both sides (one arm and engine named twice) is the reference's
            candidate.append(f"NOT {reference[0]}")
        return " AND ".join(reference), " AND ".join(candidate)

    def _firsts(self, condition: str) -> tuple[str, int, int]:
        """The first record per frame and policy version among those meeting `condition` (by time, then
        store order), as a temporary table kept for the other pairings that share that side; with how many
        records met it and how many came first."""
        if condition not in self._side_tables:
            name = f"firsts_{len(self._side_tables)}"
            self.db.execute(
                f"""
                CREATE TABLE {name} AS
                SELECT * EXCLUDE (nth) FROM (
                    SELECT {_PAIR_COLUMNS}, row_number() OVER (
                        PARTITION BY frame_sha256, policy_version ORDER BY recorded_at, seq
                    ) AS nth
                    FROM week WHERE {condition}
                ) WHERE nth = 1
                """
            )
            eligible = self.db.execute(f"SELECT count(*) FROM week WHERE {condition}").fetchall()[0][0]
            firsts = self.db.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]
            self._side_tables[condition] = (name, int(eligible), int(firsts))
        return self._side_tables[condition]

    def _pair_table(self, query: PairQuery) -> tuple[str, dict[str, int]]:
        """The pairing as a table, a row per paired frame: its place in pairing order (`pair_at`, `seq`: the
        reference record's time, then its store order), its video cluster (`cluster`: the video, or for a
        frame without one a key of its own) and the narrow columns the counts read; with what did not pair.
        No window over all pairs: a single ordered partition is what DuckDB cannot spill.

        The first record of each side per frame and policy version wins (by time, then store order), as
        `contracts.records.pair_records` does. Each side is ranked once per week: the report's pairings
        share their thinking-on and thinking-off sides.
        """
        if query in self._pair_tables:
            return self._pair_tables[query]
        reference, candidate = self._sides(query)
        reused = 0
        if query.skip_reused_candidates:
            every = self._sides(replace(query, skip_reused_candidates=False))[1]
            skipped = f"SELECT count(*) FROM week WHERE {every} AND reused"
            reused = int(self.db.execute(skipped).fetchall()[0][0])
        ref_table, ref_eligible, firsts_r = self._firsts(reference)
        cand_table, cand_eligible, firsts_c = self._firsts(candidate)
        name = f"pairs_{len(self._pair_tables)}"
        self.db.execute(
            f"""
            CREATE TABLE {name} AS
            SELECT
                r.recorded_at AS pair_at, r.seq AS seq,
                coalesce(nullif(r.video_id, ''), c.video_id, chr(0) || r.seq::VARCHAR) AS cluster,
                r.tenant AS tenant,
                r.flagged AS ref_flagged, c.flagged AS cand_flagged,
                list_position({_ACTIONS}, r.action) - 1 AS ref_action,
                list_position({_ACTIONS}, c.action) - 1 AS cand_action,
                coalesce(r.categories, []::VARCHAR[]) AS ref_categories,
                coalesce(c.categories, []::VARCHAR[]) AS cand_categories,
                coalesce(r.human_label, c.human_label).flagged AS label_flagged,
                c.confidence AS confidence,
                coalesce(c.selection = 'escalation', false) AS escalation,
                c.selection_probability AS probability
            FROM {ref_table} r JOIN {cand_table} c
              ON r.frame_sha256 = c.frame_sha256 AND r.policy_version = c.policy_version
            """
        )
        paired = int(self.db.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0])
        notes = {
            "duplicates": ref_eligible + cand_eligible - firsts_r - firsts_c,
            "unpaired_reference": firsts_r - paired,
            "unpaired_candidate": firsts_c - paired,
            "reused_candidates": reused,
            "paired": paired,
        }
        self._pair_tables[query] = (name, notes)
        return name, notes

    def pair_counts(
        self, query: PairQuery, *, breakdown: bool = False, categories: bool = False
    ) -> tuple[PairCounts, dict[str, int]]:
        """The pairing as counts per video (`quality.columns.PairCounts`), and what did not pair;
        with `breakdown`, its per-category, per-tenant and human-label tables too (the main comparison's
        sections read them; the other comparisons need only their cells and actions); with `categories`,
        the per-category table alone (the engine comparison judges its categories).

        Only counts come back from the database: a row per video, per (category, video) and per (tenant,
        video), so the report's memory follows the week's videos, not its pairs."""
        table, notes = self._pair_table(query)
        cells, _ = self._cells(_coded(table))
        actions = np.zeros((len(ACTIONS), len(ACTIONS)), dtype=np.int64)
        for ref, cand, n in self.db.execute(
            f"SELECT ref_action, cand_action, count(*) FROM {table} GROUP BY ALL"
        ).fetchall():
            actions[ref, cand] = n
        pair_counts = PairCounts(
            reference=query.reference,
            candidate=query.candidate,
            frames=notes["paired"],
            cells=cells,
            actions=actions,
            categories=self._categories(table, cells) if breakdown or categories else {},
            tenants=self._tenants(table) if breakdown else [],
            labelled=self._labelled(table) if breakdown else np.zeros((2, 2, 2), dtype=np.int64),
        )
        return pair_counts, notes

    def _categories(self, table: str, cells: IntArray) -> dict[str, IntArray]:
        """Each category either side named, sorted: its (videos, 4) cells, videos as in `cells`."""
        totals = cells.sum(axis=1)
        # arrow, not numpy: a row per (category, video) keeps its name as bytes in one buffer, where numpy
        # would make a Python string of every row's (millions of objects at ten million pairs)
        rows = self.db.sql(_coded(table) + _CATEGORY_CELLS).to_arrow_table()
        names = rows.column("category").combine_chunks()
        columns = {field: _integers(rows, field) for field in ("video", "both", "ref_only", "cand_only")}
        del rows
        categories: dict[str, IntArray] = {}
        for category in sorted(pc.unique(names).to_pylist()):
            chosen = _rows_named(names, category)
            named = np.zeros_like(cells)
            video = columns["video"][chosen]
            for column, field in enumerate(("both", "ref_only", "cand_only")):
                named[video, column] = columns[field][chosen]
            named[:, 3] = totals - named[:, :3].sum(axis=1)
            categories[str(category)] = named
        return categories

    def _labelled(self, table: str) -> IntArray:
        """(2, 2, 2) pairs with a human label: label flagged × reference flagged × candidate flagged."""
        labelled = np.zeros((2, 2, 2), dtype=np.int64)
        for label, ref, cand, n in self.db.execute(
            f"SELECT label_flagged, ref_flagged, cand_flagged, count(*) FROM {table} "
            "WHERE label_flagged IS NOT NULL GROUP BY ALL"
        ).fetchall():
            labelled[int(label), int(ref), int(cand)] = n
        return labelled

    def _cells(self, coded: str, by: str = "") -> tuple[IntArray, Any]:
        """(videos, 4) cells of the coded pairs, by video code (first by the column `by`, when given),
        and that column of each row (None without `by`)."""
        keys = f"{by}, video" if by else "video"
        result = self.db.sql(coded + _CELLS.format(keys=keys)).to_arrow_table()
        cells = np.stack([_integers(result, c) for c in _CELL_NAMES], axis=1)
        return cells, (result.column(by).combine_chunks() if by else None)

    def _tenants(self, table: str) -> list[TenantCounts]:
        """Each tenant's cells over its own videos, largest tenant first (ties: first to appear)."""
        sizes = self.db.execute(
            f"SELECT tenant, count(*) AS frames FROM {table} GROUP BY tenant "
            "ORDER BY frames DESC, min(struct_pack(pair_at, seq))"
        ).fetchall()
        cells, tenants = self._cells(_coded(table, partition="tenant"), by="tenant")
        return [
            TenantCounts(str(tenant), int(frames), cells[_rows_named(tenants, tenant)])
            for tenant, frames in sizes
        ]

    def threshold_frames(self, query: PairQuery, sample: str, always: Sequence[str]) -> ThresholdFrames:
        """The escalation section's sample, a frame each in pairing order (five narrow columns): the pairs
        escalation did not choose (`random`), or every pair with its inverse-probability weight (`ipw`)."""
        table, _ = self._pair_table(query)
        named = (
            f"list_has_any(cand_categories, [{', '.join(_literal(c) for c in always)}]::VARCHAR[])"
            if always
            else "false"
        )
        block, review = ACTIONS.index("block"), ACTIONS.index("review")
        kept = "NOT escalation" if sample == "random" else "true"
        ipw = sample == "ipw"
        wanted = {"video": np.int64, "confidence": np.float64, "forced": np.bool_, "disagree": np.bool_}
        if ipw:
            wanted["probability"] = np.float64
        size = int(self.db.execute(f"SELECT count(*) FROM {table} WHERE {kept}").fetchall()[0][0])
        columns: dict[str, np.ndarray[Any, Any]] = {n: np.empty(size, dtype=t) for n, t in wanted.items()}
        reader = self.db.sql(
            _coded(table, where=kept)
            + f"""
            SELECT video, confidence,
                cand_action = {review} OR {named} OR confidence IS NULL OR isnan(confidence) AS forced,
                ref_action <> cand_action OR (cand_action = {block}
                    AND list_sort(list_distinct(ref_categories)) <> list_sort(list_distinct(cand_categories)))
                    AS disagree,
                {"probability" if ipw else "NULL AS probability"}
            FROM coded ORDER BY pair_at, seq
            """
        ).to_arrow_reader(_BATCH_ROWS)
        # a batch at a time into arrays of the final size: never the whole result twice (arrow and numpy)
        filled = 0
        for batch in reader:
            rows = batch.num_rows
            for name, array in columns.items():
                array[filled : filled + rows] = batch.column(name).to_numpy(zero_copy_only=False)
            filled += rows
        if filled != size:
            raise RuntimeError(f"the escalation sample changed while it was read: {filled} rows, not {size}")
        escalated = self.db.execute(f"SELECT count(*) FROM {table} WHERE escalation").fetchall()[0][0]
        confidence = columns["confidence"]
        return ThresholdFrames(
            confidence=confidence,
            forced=columns["forced"],
            disagree=columns["disagree"],
            weight=inverse_probability_weights(columns["probability"]) if ipw else unit_weights(size),
            video=columns["video"],
            escalation_pairs=int(escalated),
            without_confidence=int(np.isnan(confidence).sum()),
        )

    def arm_columns(self, arm: str, engine: str) -> tuple[Callable[[str], pa.Array], int, int]:
        """An arm's fresh verdicts' columns (latency, TTFT, tokens), fetched one at a time so a week
        holds one of them at once; how many fresh verdicts there are, and how many were cache hits."""
        where = f"arm = {_literal(arm)} AND engine = {_literal(engine)}"
        fresh, hits = self.db.execute(
            "SELECT count(*) FILTER (WHERE NOT reused), count(*) FILTER (WHERE reused) "
            f"FROM week WHERE {where}"
        ).fetchall()[0]

        def column(name: str) -> pa.Array:
            if name not in _COST_COLUMNS:
                raise ValueError(f"not a cost column: {name}")
            table = self.db.sql(f"SELECT {name} FROM week WHERE {where} AND NOT reused").to_arrow_table()
            return table.column(0).combine_chunks()

        return column, int(fresh), int(hits)
