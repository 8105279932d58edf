"""The relational half of the weekly report, as SQL: the week's records, deduplicated, paired, counted.

Everything that touches every record is a query here (DuckDB over Parquet partitions or arrow
batches); what comes back is one row per *pair* with a handful of narrow columns, or one row per group.
The statistics (:mod:`quality.columns`, :mod:`quality.sections`) only ever see those. The queries are
plain SQL (window functions, joins, group by) with nothing DuckDB-only but `read_parquet`, so the same
text runs as Spark SQL or Trino over the same partitions when a week outgrows one machine
(docs/quality.md says how).

Order is part of the result: a report's video bootstrap draws whole videos in the order they first
appear, as the record-by-record code did, so every query orders by the record's time and then its
position in the store (`seq`), and the numbers are the same to the last bit.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from quality.columnar import RECORD_SCHEMA

__all__ = ["PairQuery", "WeekCounts", "WeekQueries"]

# How much memory DuckDB may hold before it spills to its temporary directory: the report's own ceiling.
MEMORY_LIMIT = "600MB"


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


class WeekQueries:
    """One week's records behind a DuckDB connection, as the view `week` (with its store order `seq`)."""

    def __init__(
        self, connection: duckdb.DuckDBPyConnection, spill: tempfile.TemporaryDirectory[str]
    ) -> None:
        self.db = connection
        self._spill = spill
        # each pairing side ranked so far: condition -> (temporary table, records meeting it, firsts)
        self._side_tables: dict[str, tuple[str, int, int]] = {}

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
        # DuckDB spills past its memory limit into a folder of its own, removed on close
        spill = tempfile.TemporaryDirectory(prefix="modgate-duckdb-")
        db = duckdb.connect(
            config={
                "memory_limit": MEMORY_LIMIT,
                "preserve_insertion_order": True,
                "temp_directory": spill.name,
            }
        )
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
                CREATE TEMP TABLE {name} AS
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

    def pairs(self, query: PairQuery) -> tuple[pa.Table, dict[str, int]]:
        """One row per paired frame, in the order of its reference record; and what did not pair.

        The first record of each side per frame and policy version wins (by time, then store order), as
        `quality.records.pair_records` does. Each side is ranked once per week: the report's pairings
        share their thinking-on and thinking-off sides.
        """
        reference, candidate = self._sides(query)
        reused = 0
        if query.skip_reused_candidates:
            every = self._sides(replace(query, skip_reused_candidates=False))[1]
            skipped = f"SELECT count(*) FROM week WHERE {every} AND reused"
            reused = int(self.db.execute(skipped).fetchall()[0][0])
        ref_table, ref_eligible, firsts_r = self._firsts(reference)
        cand_table, cand_eligible, firsts_c = self._firsts(candidate)
        eligible = ref_eligible + cand_eligible
        table = self.db.sql(
            f"""
            SELECT
                r.flagged AS ref_flagged, c.flagged AS cand_flagged,
                r.action AS ref_action, c.action AS cand_action,
                r.categories AS ref_categories, c.categories AS cand_categories,
                coalesce(nullif(r.video_id, ''), c.video_id) AS video_id,
                r.tenant AS tenant,
                coalesce(r.human_label, c.human_label).flagged AS label_flagged,
                c.confidence AS cand_confidence,
                c.selection AS cand_selection,
                c.selection_probability AS cand_selection_probability
            FROM {ref_table} r JOIN {cand_table} c
              ON r.frame_sha256 = c.frame_sha256 AND r.policy_version = c.policy_version
            ORDER BY r.recorded_at, r.seq
            """
        ).to_arrow_table()
        paired = table.num_rows
        notes = {
            "duplicates": int(eligible) - int(firsts_r) - int(firsts_c),
            "unpaired_reference": int(firsts_r) - paired,
            "unpaired_candidate": int(firsts_c) - paired,
            "reused_candidates": reused,
        }
        return table, notes

    def arm_columns(self, arm: str, engine: str) -> tuple[pa.Table, int]:
        """An arm's fresh verdicts' latency, TTFT and token columns, and how many were cache hits."""
        fresh = self.db.sql(
            "SELECT latency_ms, ttft_ms, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens "
            f"FROM week WHERE arm = {_literal(arm)} AND NOT reused AND engine = {_literal(engine)}"
        ).to_arrow_table()
        hits = self.db.execute(
            "SELECT count(*) FROM week WHERE arm = $arm AND reused AND engine = $engine",
            {"arm": arm, "engine": engine},
        ).fetchall()
        return fresh, int(hits[0][0])
