"""Verdict records as columns: the Parquet schema, partitions by ISO week, and conversion from JSONL.

A week of a fleet's shadow pairs is millions of records; as pydantic objects it outgrows a CronJob pod.
Here records are arrow columns from the start: the gateway's JSONL files and the Redis stream are read
into arrow batches a slice at a time, and a week lives as Parquet under
``DIRECTORY/week=2026-W48/part-*.parquet`` (one folder per ISO week of ``recorded_at``, the same week a
JSONL file holds), which :mod:`quality.weekly_sql` reads with DuckDB without loading it whole.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from contracts.records import VerdictRecord, format_iso_week, parse_iso_week

__all__ = [
    "RECORD_SCHEMA",
    "convert_jsonl_weeks",
    "jsonl_batches",
    "jsonl_path",
    "partition_dir",
    "record_batches",
    "records_table",
    "week_partitions",
    "week_source",
    "write_week_partition",
]

logger = logging.getLogger(__name__)

_LABEL = pa.struct([("flagged", pa.bool_()), ("action", pa.string())])
# One column per VerdictRecord field, in its order (a test holds the two together).
RECORD_SCHEMA = pa.schema(
    [
        ("frame_sha256", pa.string()),
        ("video_id", pa.string()),
        ("tenant", pa.string()),
        ("arm", pa.string()),
        ("action", pa.string()),
        ("flagged", pa.bool_()),
        ("categories", pa.list_(pa.string())),
        ("policy_version", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("reasoning_tokens", pa.int64()),
        ("latency_ms", pa.float64()),
        ("ttft_ms", pa.float64()),
        ("recorded_at", pa.timestamp("us", tz="UTC")),
        ("source", pa.string()),
        ("request_id", pa.string()),
        ("reused", pa.bool_()),
        ("input_sha256", pa.string()),
        ("human_label", _LABEL),
        ("confidence", pa.float64()),
        ("selection", pa.string()),
        ("selection_probability", pa.float64()),
        ("engine", pa.string()),
    ]
)
BATCH_ROWS = 65_536


def _row(record: VerdictRecord) -> dict[str, Any]:
    row = record.model_dump(mode="python")
    row.setdefault("engine", "vllm")  # records written before the engine was an arm
    return row


def record_batches(records: Iterable[VerdictRecord], rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Records as arrow batches of up to `rows`, so a stream of objects never sits in memory whole."""
    chunk: list[dict[str, Any]] = []
    for record in records:
        chunk.append(_row(record))
        if len(chunk) >= rows:
            yield pa.RecordBatch.from_pylist(chunk, schema=RECORD_SCHEMA)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk, schema=RECORD_SCHEMA)


def records_table(records: Iterable[VerdictRecord]) -> pa.Table:
    """Records as one arrow table (built a batch at a time)."""
    return pa.Table.from_batches(record_batches(records), RECORD_SCHEMA)


def _lines(path: Path) -> Iterator[VerdictRecord]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                yield VerdictRecord.model_validate_json(line)
            except ValidationError:
                # a line cut short by a crash, or written by a newer version: skip it, keep the rest
                logger.warning("skipping an unreadable quality record in %s", path)


def jsonl_batches(path: Path, rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """A JSONL record file as validated arrow batches (each line checked as the stores check it)."""
    return record_batches(_lines(path), rows)


def partition_dir(directory: Path, year: int, week: int) -> Path:
    return directory / f"week={format_iso_week(year, week)}"


def week_partitions(directory: Path) -> dict[str, Path]:
    """The ISO weeks with a Parquet partition under `directory`: `{"2026-W48": path}`."""
    found = {}
    for path in sorted(directory.glob("week=*")):
        label = path.name.removeprefix("week=")
        try:
            parse_iso_week(label)
        except ValueError:
            continue
        if any(path.glob("*.parquet")):
            found[label] = path
    return found


def _week_labels(batch: pa.RecordBatch) -> pa.Array:
    moments = batch.column("recorded_at")
    iso_years, iso_weeks = pc.iso_year(moments), pc.iso_week(moments)
    return pc.binary_join_element_wise(
        pc.cast(iso_years, pa.string()),
        pc.utf8_lpad(pc.cast(iso_weeks, pa.string()), 2, "0"),
        "-W",
    )


def write_week_partition(
    records: pa.Table | Iterable[pa.RecordBatch],
    directory: Path,
    *,
    rows_per_file: int = 2_000_000,
    only_week: str | None = None,
) -> list[Path]:
    """Append records to the Parquet partitions of their ISO weeks; returns the files written.

    `only_week` keeps the records of one week (a JSONL file is read for its own week only, as
    `JsonlRecordStore.read_week` reads it).

    Each call writes new part files (never rewrites old ones), so a converter and a later run can add to
    the same week; a part file is written under a temporary name and renamed, so readers never see half.
    """
    batches = records.to_batches(BATCH_ROWS) if isinstance(records, pa.Table) else records
    writers: dict[str, tuple[pq.ParquetWriter, Path, int]] = {}
    written: list[Path] = []

    def close(label: str) -> None:
        writer, path, _ = writers.pop(label)
        writer.close()
        final = path.with_suffix("")  # drop ".tmp"
        path.replace(final)
        written.append(final)

    for batch in batches:
        if batch.num_rows == 0:
            continue
        batch = batch.select(RECORD_SCHEMA.names).cast(RECORD_SCHEMA)
        labels = _week_labels(batch)
        for label in pc.unique(labels).to_pylist():
            if only_week is not None and label != only_week:
                continue
            part = batch.filter(pc.equal(labels, label))
            if label not in writers:
                folder = partition_dir(directory, *parse_iso_week(label))
                folder.mkdir(parents=True, exist_ok=True)
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
                path = folder / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet.tmp"
                writers[label] = (pq.ParquetWriter(path, RECORD_SCHEMA, compression="zstd"), path, 0)
            writer, path, count = writers[label]
            writer.write_batch(part)
            writers[label] = (writer, path, count + part.num_rows)
            if count + part.num_rows >= rows_per_file:
                close(label)
    for label in list(writers):
        close(label)
    return written


def jsonl_path(directory: Path, year: int, week: int) -> Path:
    """Where `contracts.records.JsonlRecordStore` keeps a week."""
    return directory / f"records-{format_iso_week(year, week)}.jsonl"


def week_source(directory: Path, year: int, week: int, scratch: Path) -> Path | None:
    """The folder of Parquet files that holds a week's records, or None when `directory` has none.

    The week's own partition when it is at least as new as the week's JSONL file; otherwise the JSONL
    file (which the gateway may still be appending to) is converted into `scratch` a batch at a time.
    """
    partition = partition_dir(directory, year, week)
    jsonl = jsonl_path(directory, year, week)
    parts = list(partition.glob("*.parquet")) if partition.is_dir() else []
    if parts and (not jsonl.exists() or max(p.stat().st_mtime for p in parts) >= jsonl.stat().st_mtime):
        return partition
    if not jsonl.exists():
        return None
    write_week_partition(jsonl_batches(jsonl), scratch, only_week=format_iso_week(year, week))
    return partition_dir(scratch, year, week)


def convert_jsonl_weeks(directory: Path, *, replace: bool = False) -> dict[str, int]:
    """Every `records-*.jsonl` week under `directory` as its Parquet partition; returns records per week.

    A week that already has a partition is left alone unless `replace` (then its part files are removed
    first, after the new ones are written). JSONL files are kept: the gateway appends to them.
    """
    converted: dict[str, int] = {}
    for path in sorted(directory.glob("records-*.jsonl")):
        label = path.stem.removeprefix("records-")
        try:
            year, week = parse_iso_week(label)
        except ValueError:
            continue
        partition = partition_dir(directory, year, week)
        old = sorted(partition.glob("*.parquet")) if partition.is_dir() else []
        if old and not replace:
            continue
        written = write_week_partition(jsonl_batches(path), directory, only_week=label)
        for stale in old:
            stale.unlink()
        converted[label] = sum(pq.ParquetFile(p).metadata.num_rows for p in written)
    return converted
