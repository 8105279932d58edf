"""The columnar report: the same numbers as the record-by-record code, from JSONL, Parquet and objects.

`report-before-2026-W48.json` was written by the record-by-record report (pydantic objects, numpy's
`multinomial` bootstrap draws); `report-2026-W48.json` by today's columnar report on the same records, whose
draws count uniform indices instead (the same distribution, another random stream). Both paths must write
today's file byte for byte, and it must say what the old one said: every figure not drawn by the bootstrap
the same, every interval bound within the resampling's own noise.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pickle
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from contracts.records import JsonlRecordStore, VerdictRecord, pair_records, week_bounds
from quality.columnar import RECORD_SCHEMA, convert_jsonl_weeks, partition_dir, records_table, week_source
from quality.columns import (
    PairColumns,
    PairCounts,
    ThresholdFrames,
    inverse_probability_weights,
    run_bootstrap,
    unit_weights,
)
from quality.report import ReportPolicy, WeeklyReport, build_weekly_report, build_weekly_report_from
from quality.week_stage import week_tables
from quality.weekly_sql import PairQuery, WeekQueries

DATA = Path(__file__).parent / "data"
# Written by the record-by-record report (pydantic objects, before the columnar one) on the same records.
BEFORE = DATA / "report-before-2026-W48.json"
# Written by the columnar report with the counted draws (`quality.columns.run_bootstrap`).
PINNED = DATA / "report-2026-W48.json"
# What the bootstrap draws: interval bounds (and the trend's, the lower of Wilson's and the bootstrap's),
# the design effect (the bootstrap's variance over the binomial's) and the sample size it scales
DRAWN = frozenset({
    "low", "high", "bootstrap_low", "bootstrap_high", "agreement_low", "agreement_high",
    "flagged_agreement_low", "flagged_agreement_high", "noise_floor_low", "noise_floor_high",
})
POLICY = ReportPolicy(bootstrap_resamples=500)
GENERATED = datetime(2026, 12, 1, tzinfo=UTC)


# fields added since, each filled only by what these records lack: a second engine; the decision log (its
# labels and per-tenant decisions, with the policy's label minimum and the summary's figures of them)
LATER_FIELDS: dict[str, Any] = {
    "engines": True, "labels": True, "tenant_decisions": True, "policy": {"min_threshold_labels"},
    "trend": {"__all__": {"label_accuracy", "threshold_source", "tenants"}},
}


def _as_before(report: WeeklyReport) -> str:
    """The JSON as written before the fields a second engine or the decision log fill existed."""
    assert report.engines is None
    assert report.labels is None
    assert not report.tenant_decisions
    return report.model_dump_json(indent=2, exclude=LATER_FIELDS)


@pytest.fixture
def records_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "records"
    directory.mkdir()
    (directory / "records-2026-W48.jsonl").write_bytes(
        gzip.decompress((DATA / "records-2026-W48.jsonl.gz").read_bytes())
    )
    return directory


def test_the_report_from_records_is_byte_for_byte_the_one_written_before(records_dir: Path) -> None:
    records = JsonlRecordStore(records_dir).read_week_sync(2026, 48)
    report = build_weekly_report(records, "2026-W48", POLICY, generated_at=GENERATED)
    assert _as_before(report) == PINNED.read_text(encoding="utf-8")


def _differences(before: Any, now: Any, path: str = "") -> list[str]:
    """Where `now` says something else than `before`, beyond what another stream of draws may move."""
    key = path.rsplit(".", 1)[-1]
    if isinstance(before, dict) and isinstance(now, dict):
        if before.keys() != now.keys():
            return [f"{path}: fields {sorted(before.keys() ^ now.keys())}"]
        return [d for k in before for d in _differences(before[k], now[k], f"{path}.{k}")]
    if isinstance(before, list) and isinstance(now, list):
        if len(before) != len(now):
            return [f"{path}: {len(before)} items, now {len(now)}"]
        return [d for i, (b, n) in enumerate(zip(before, now, strict=True)) for d in _differences(b, n, path)]
    if isinstance(before, float) and isinstance(now, float):
        if key in DRAWN:  # a 2.5 % quantile of 500 resamples: its Monte Carlo error, not a change
            close = math.isclose(before, now, abs_tol=0.02)
        elif key == "design_effect":  # a ratio of variances, floored at 1
            close = math.isclose(before, now, abs_tol=0.15)
        elif key == "action_kappa":  # statsmodels' kappa of the table, scikit-learn's before
            close = math.isclose(before, now, rel_tol=1e-12)
        else:
            close = before == now
        return [] if close else [f"{path}: {before} → {now}"]
    if path == ".sample_size.frames":  # scaled by the design effect
        return [] if math.isclose(before, now, rel_tol=0.05) else [f"{path}: {before} → {now}"]
    if isinstance(before, str) and isinstance(now, str):  # the sentences, their figures aside
        digits = re.compile(r"[0-9][0-9.,]*")
        return [] if digits.sub("#", before) == digits.sub("#", now) else [f"{path}: {before!r} → {now!r}"]
    return [] if before == now else [f"{path}: {before!r} → {now!r}"]


def test_today_s_report_says_what_the_record_by_record_report_said() -> None:
    before = json.loads(BEFORE.read_text(encoding="utf-8"))
    now = json.loads(PINNED.read_text(encoding="utf-8"))
    assert _differences(before, now) == []
    # and the check would see a change: a point estimate, a count, a verdict's words
    assert _differences(before, {**now, "comparison": {**now["comparison"], "frames": 1}})
    moved = {**now["comparison"]["agreement"], "value": now["comparison"]["agreement"]["value"] + 1e-9}
    assert _differences(before, {**now, "comparison": {**now["comparison"], "agreement": moved}})
    assert _differences(before, {**now, "recommendation": {**now["recommendation"], "title": "Turn it off"}})


def test_the_report_from_the_parquet_partition_is_byte_for_byte_the_same(records_dir: Path) -> None:
    converted = convert_jsonl_weeks(records_dir)
    # the file also holds 22 records of the next week, which the JSONL store never reads for week 48
    assert converted == {"2026-W48": 8846 - 22}
    partition = partition_dir(records_dir, 2026, 48)
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in partition.glob("*.parquet")) == 8824
    report = build_weekly_report_from(partition, "2026-W48", POLICY, generated_at=GENERATED)
    assert _as_before(report) == PINNED.read_text(encoding="utf-8")
    assert convert_jsonl_weeks(records_dir) == {}  # converted weeks are left alone


def test_a_week_whose_jsonl_is_newer_than_its_partition_is_read_from_the_jsonl(
    records_dir: Path, tmp_path: Path
) -> None:
    convert_jsonl_weeks(records_dir)
    partition = partition_dir(records_dir, 2026, 48)
    assert week_source(records_dir, 2026, 48, tmp_path / "scratch") == partition
    jsonl = records_dir / "records-2026-W48.jsonl"
    newer = max(p.stat().st_mtime for p in partition.glob("*.parquet")) + 10
    os.utime(jsonl, (newer, newer))
    fresh = week_source(records_dir, 2026, 48, tmp_path / "scratch")
    assert fresh is not None
    assert fresh != partition
    assert fresh.is_relative_to(tmp_path / "scratch")


def test_the_parquet_schema_has_a_column_for_every_record_field_in_order() -> None:
    assert RECORD_SCHEMA.names == list(VerdictRecord.model_fields)


def test_bootstrap_weights_drawn_a_slice_at_a_time_are_the_draws_of_one_call() -> None:
    class Collect:
        def __init__(self) -> None:
            self.rows: list[np.ndarray] = []

        def feed(self, start: int, weights: np.ndarray) -> None:
            assert start == sum(r.shape[0] for r in self.rows)
            self.rows.append(weights.copy())

    sliced = Collect()
    run_bootstrap([(300, 250, 11, sliced)], cells=300 * 40)
    assert len(sliced.rows) == 7  # 40 resamples a slice
    # each resample: 300 videos drawn with replacement, a video's weight the times it was drawn
    rng = np.random.default_rng(11)
    whole = np.stack([np.bincount(rng.integers(0, 300, size=300, dtype=np.int32), minlength=300)
                      for _ in range(250)])
    assert np.array_equal(np.vstack(sliced.rows), whole)
    assert (whole.sum(axis=1) == 300).all()


def test_records_of_the_old_form_without_an_engine_read_as_vllm(tmp_path: Path) -> None:
    line = gzip.decompress((DATA / "records-2026-W48.jsonl.gz").read_bytes()).split(b"\n", 1)[0]
    assert b'"engine"' not in line
    assert VerdictRecord.model_validate_json(line).engine == "vllm"


@pytest.mark.parametrize("sample", ["random", "ipw"])
def test_the_sql_counts_and_frames_are_those_of_the_pairs_as_objects(records_dir: Path, sample: str) -> None:
    """What the report reads from the database (counts per video, the threshold's frames) against the
    same figures computed from the week's pairs as objects, array for array."""
    records = JsonlRecordStore(records_dir).read_week_sync(2026, 48)
    columns = PairColumns.from_pairs(pair_records(records).pairs)
    start, end = week_bounds(2026, 48)
    queries = WeekQueries.open(records_table(records), start, end)
    try:
        counts, notes = queries.pair_counts(PairQuery("thinking_on", "thinking_off"), breakdown=True)
        frames = queries.threshold_frames(PairQuery("thinking_on", "thinking_off"), sample, ["violence"])
    finally:
        queries.close()
    expected = PairCounts.from_columns(columns)
    assert counts.frames == expected.frames == notes["paired"] > 1000
    assert counts.n_videos == expected.n_videos < counts.frames  # frames of one video share a cluster
    for name in ("cells", "actions", "labelled"):
        assert np.array_equal(getattr(counts, name), getattr(expected, name)), name
    assert list(counts.categories) == list(expected.categories)
    assert len(counts.categories) >= 3
    for category, cells in expected.categories.items():
        assert np.array_equal(counts.categories[category], cells), category
    assert [(t.tenant, t.frames) for t in counts.tenants] == [(t.tenant, t.frames) for t in expected.tenants]
    assert len(counts.tenants) > 1
    for got, want in zip(counts.tenants, expected.tenants, strict=True):
        assert np.array_equal(got.cells, want.cells), got.tenant
    want_frames = ThresholdFrames.from_columns(columns, sample, ["violence"])
    assert frames.size == want_frames.size > 0
    assert (frames.escalation_pairs, frames.without_confidence) == (
        want_frames.escalation_pairs,
        want_frames.without_confidence,
    )
    assert frames.forced.any()
    assert frames.disagree.any()
    for name in ("confidence", "forced", "disagree", "weight", "video"):
        assert np.array_equal(getattr(frames, name), getattr(want_frames, name), equal_nan=True), name


def test_the_sql_stage_in_a_process_of_its_own_hands_back_what_it_computes_here(records_dir: Path) -> None:
    """A week on disk is queried in a child process (its memory leaves with it): its tables, read back
    from the child's pickles, are the in-process ones array for array."""
    convert_jsonl_weeks(records_dir)
    partition = partition_dir(records_dir, 2026, 48)
    start, end = week_bounds(2026, 48)
    here = week_tables(partition, start, end, POLICY, isolate=False)
    child = week_tables(partition, start, end, POLICY)  # a folder: isolated by default
    assert child.counts == here.counts
    assert (child.engine, child.pairing, child.rerun_notes) == (here.engine, here.pairing, here.rerun_notes)
    assert child.costs == here.costs
    assert len(child.formats) == len(here.formats)
    compared = [(child.main, here.main), (child.rerun, here.rerun)]
    for mine, theirs in [*compared, *zip(child.formats, here.formats, strict=True)]:
        assert np.array_equal(mine.cells, theirs.cells)
        assert np.array_equal(mine.actions, theirs.actions)
        assert mine.categories.keys() == theirs.categories.keys()
        assert all(np.array_equal(mine.categories[c], theirs.categories[c]) for c in mine.categories)
        assert [t.tenant for t in mine.tenants] == [t.tenant for t in theirs.tenants]
    for name in ("confidence", "forced", "disagree", "weight", "video"):
        assert np.array_equal(getattr(child.escalation, name), getattr(here.escalation, name), equal_nan=True)
    assert child.escalation.weight.strides == (0,)  # unit weights come back as a view, not a float a frame


@pytest.mark.parametrize("sample", ["random", "ipw"])
def test_threshold_frames_pickle_unit_weights_as_their_count(sample: str) -> None:
    probability = np.array([0.5, np.nan, 0.25, 1.0])
    weight = inverse_probability_weights(probability) if sample == "ipw" else unit_weights(4)
    frames = ThresholdFrames(
        confidence=np.array([0.9, np.nan, 0.2, 0.5]),
        forced=np.array([False, True, False, False]),
        disagree=np.array([False, True, True, False]),
        weight=weight,
        video=np.array([0, 0, 1, 2]),
        escalation_pairs=1,
        without_confidence=1,
    )
    written = pickle.dumps(frames, protocol=pickle.HIGHEST_PROTOCOL)
    back = pickle.loads(written)  # noqa: S301 - written by this test
    assert np.array_equal(back.weight, weight)
    assert (back.weight.strides == (0,)) == (sample == "random")
    big = replace(frames, weight=unit_weights(1_000_000), confidence=np.zeros(0))
    assert len(pickle.dumps(big, protocol=pickle.HIGHEST_PROTOCOL)) < 1000  # no float per frame
