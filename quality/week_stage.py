"""The weekly report's SQL stage: every query over the week's records, run where its memory goes back.

:func:`query_week` asks a :class:`quality.weekly_sql.WeekQueries` everything the report's sections read
(the counts, each pairing's counts per video, the escalation sample, the arms' costs) and hands it back
as :class:`WeekTables`: numpy arrays and small dataclasses, never a row per record. The engine is whatever
`WeekQueries` wraps (DuckDB today); nothing here depends on it.

:func:`week_tables` runs that stage in a process of its own for a week on disk (`python -m
quality.week_stage`): DuckDB's buffers and what its and glibc's allocators keep after `close` (about
700 MB at ten million pairs) leave with the process instead of staying beside the bootstrap. The child
writes each result to a file as soon as it has it (pickled, its arrays in one piece) and lets go of it,
so it never holds more than DuckDB and one result; the parent reads them once the child has exited.
The module imports only the SQL side (no scikit-learn, statsmodels or matplotlib), so the child starts
light.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import quality
from contracts.records import ARMS, Arm
from contracts.summaries import ArmCost, ReportPolicy
from quality.columns import PairCounts, ThresholdFrames
from quality.weekly_sql import PairQuery, WeekCounts, WeekQueries

__all__ = [
    "FORMAT_COMPARISONS",
    "EngineCounts",
    "WeekTables",
    "arm_cost",
    "limit_malloc_arenas",
    "primary_engine",
    "query_week",
    "week_tables",
]

FORMAT_COMPARISONS: tuple[tuple[Arm, Arm], ...] = (
    ("thinking_off_json", "thinking_off"),  # does the compact form change what thinking off says?
    ("thinking_on", "thinking_off_json"),  # the JSON form's own agreement with thinking on
    ("thinking_on_json", "thinking_on"),  # the format with thinking on
)

# glibc's mallopt parameter for the most malloc arenas a process keeps (malloc.h)
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Hold glibc to `arenas` malloc arenas for the rest of the process; False where that is not glibc.

    Every thread that allocates gets an arena of its own by default (up to 8 per core), and memory freed
    in one is not reused by another: the report's DuckDB threads, its builder thread and the bootstrap's
    workers each kept what they had freed, 1.2 GB of resident memory for the 1M-pair week against 0.86 GB
    with two arenas. Call it before the threads start (the report command and the SQL stage's process do).
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(ctypes.c_int(_M_ARENA_MAX), ctypes.c_int(arenas)))


def primary_engine(engines: list[str]) -> str:
    """The reference engine of a week: vLLM when it judged anything (the engine the policy is tuned on)."""
    if not engines or "vllm" in engines:
        return "vllm"
    return sorted(engines)[0]


def arm_cost(arm: Arm, column: Callable[[str], pa.Array], frames: int, cache_hits: int) -> ArmCost | None:
    """Latency and tokens of an arm's `frames` fresh verdicts (cache hits are counted, not timed), from
    their columns one at a time (`column(name)`, as `quality.weekly_sql.WeekQueries.arm_columns` gives)."""
    if frames == 0:
        return None
    latency = np.asarray(column("latency_ms").to_numpy(), dtype=np.float64)
    p50, p90, p99 = (float(v) for v in np.quantile(latency, [0.5, 0.9, 0.99]))
    quantiles = [round(float(v), 1) for v in np.quantile(latency, np.linspace(0, 1, 101))]
    del latency
    ttft = np.asarray(pc.drop_null(column("ttft_ms")).to_numpy(), dtype=np.float64)

    def mean(name: str) -> float:
        return float(np.mean(np.asarray(column(name).to_numpy(), dtype=np.int64)))

    return ArmCost(
        arm=arm,
        frames=frames,
        cache_hits=cache_hits,
        latency_p50_ms=p50,
        latency_p90_ms=p90,
        latency_p99_ms=p99,
        latency_quantiles_ms=quantiles,
        ttft_p50_ms=float(np.median(ttft)) if ttft.size else None,
        mean_prompt_tokens=mean("prompt_tokens"),
        mean_cached_tokens=mean("cached_tokens"),
        mean_completion_tokens=mean("completion_tokens"),
        mean_reasoning_tokens=mean("reasoning_tokens"),
    )


@dataclass(frozen=True)
class EngineCounts:
    """One arm judged by the primary engine and by another, paired: the engine section's input."""

    other: str
    arm: Arm
    pairs: PairCounts
    cost: ArmCost | None  # the other engine's latency and tokens on this arm


@dataclass(frozen=True)
class WeekTables:
    """Everything the report's sections read of a week: counts per video, the escalation sample (five
    narrow columns a frame) and the arms' costs."""

    counts: WeekCounts
    engine: str  # the primary engine, every comparison's reference and candidate but the engines'
    main: PairCounts  # thinking on against thinking off, escalation pairs left out, with its breakdown
    pairing: dict[str, int]  # what did not pair in the main comparison
    escalation: ThresholdFrames  # thinking on against thinking off, every pair: the threshold's sample
    rerun: PairCounts
    rerun_notes: dict[str, int]
    formats: list[PairCounts]  # FORMAT_COMPARISONS that paired anything, in that order
    costs: list[ArmCost]  # per arm the primary engine judged fresh, in ARMS order
    engines: list[EngineCounts]  # per (other engine, arm) both judged


def _results(queries: WeekQueries, policy: ReportPolicy) -> Iterator[tuple[str, Any]]:
    """The stage's results one at a time, as (WeekTables field, value): a caller may let go of each."""
    counts = queries.counts()
    engine = primary_engine(counts.engines)
    yield "counts", counts
    yield "engine", engine

    def query(reference: str, candidate: str, **options: bool) -> PairQuery:
        return PairQuery(reference, candidate, reference_engine=engine, candidate_engine=engine, **options)

    # Escalation pairs are the unsure frames only: they would bias every comparison but the weighted one.
    main, pairing = queries.pair_counts(
        query("thinking_on", "thinking_off", exclude_escalation=True), breakdown=True
    )
    yield "main", main
    yield "pairing", pairing
    del main
    yield (
        "escalation",
        queries.threshold_frames(
            query("thinking_on", "thinking_off"), policy.escalation_sample, policy.always_escalate
        ),
    )
    rerun, rerun_notes = queries.pair_counts(
        query("thinking_on", "thinking_on_rerun", skip_reused_candidates=True)
    )
    yield "rerun", rerun
    yield "rerun_notes", rerun_notes
    del rerun
    formats = [
        pairs for ref, cand in FORMAT_COMPARISONS if len(pairs := queries.pair_counts(query(ref, cand))[0])
    ]
    yield "formats", formats
    del formats
    yield (
        "costs",
        [cost for arm in ARMS if (cost := arm_cost(arm, *queries.arm_columns(arm, engine))) is not None],
    )
    engines = []
    for other in (e for e in counts.engines if e != engine):
        for arm in ARMS:
            pairs, _ = queries.pair_counts(
                PairQuery(arm, arm, reference_engine=engine, candidate_engine=other), categories=True
            )
            if len(pairs):
                engines.append(
                    EngineCounts(other, arm, pairs, arm_cost(arm, *queries.arm_columns(arm, other)))
                )
    yield "engines", engines


def query_week(queries: WeekQueries, policy: ReportPolicy) -> WeekTables:
    """Every query the report needs, in this process, over an open connection."""
    return WeekTables(**dict(_results(queries, policy)))


@dataclass(frozen=True)
class _Request:
    source: Path
    start: datetime
    end: datetime
    only_source: str | None
    policy: ReportPolicy


def week_tables(
    source: Path | pa.Table,
    start: datetime,
    end: datetime,
    policy: ReportPolicy,
    *,
    only_source: str | None = None,
    isolate: bool | None = None,
) -> WeekTables:
    """The week's tables, from a folder of Parquet files or an arrow table. With `isolate` (the default
    for a folder: an arrow table is in this process's memory already) the queries run in a child process,
    whose memory goes back to the system when it exits, before the bootstrap takes its own."""
    if isolate is None:
        isolate = isinstance(source, Path)
    if not isolate:
        queries = WeekQueries.open(source, start, end, only_source=only_source)
        try:
            return query_week(queries, policy)
        finally:
            queries.close()
    if not isinstance(source, Path):
        raise ValueError("only a week on disk is queried in a process of its own")
    with tempfile.TemporaryDirectory(prefix="modgate-week-stage-") as work:
        request, result = Path(work) / "request.pickle", Path(work) / "result.pickle"
        with request.open("wb") as file:
            pickle.dump(_Request(source, start, end, only_source, policy), file)
        # the child finds this checkout's package first, whatever the parent's own sys.path came from
        package_root = str(Path(quality.__file__).resolve().parents[1])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
        }
        done = subprocess.run(  # noqa: S603 - this interpreter, this package, our own files
            [sys.executable, "-m", "quality.week_stage", str(request), str(result)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"the week's SQL stage failed (exit {done.returncode}): {done.stderr[-2000:]}")
        values: dict[str, Any] = {}
        with result.open("rb") as file:
            for _ in fields(WeekTables):
                name, value = pickle.load(file)  # noqa: S301 - written by our own child just now
                values[name] = value
        return WeekTables(**values)


def _child(request_path: Path, result_path: Path) -> None:
    """The child's side: each result written the moment it exists, then dropped."""
    limit_malloc_arenas()
    with request_path.open("rb") as file:
        request: _Request = pickle.load(file)  # noqa: S301 - written by our own parent
    queries = WeekQueries.open(request.source, request.start, request.end, only_source=request.only_source)
    try:
        with result_path.open("wb") as out:
            for item in _results(queries, request.policy):
                pickle.dump(item, out, protocol=pickle.HIGHEST_PROTOCOL)
                del item
    finally:
        queries.close()


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
