"""The decision log's rows as columns: one Parquet folder per UTC day, read back for an export.

Every decision the gateway makes (judged, reused, escalated, answered ``review`` because the engine failed)
and every human label is one :class:`DecisionRow`. The gateway appends rows to a Redis stream and moves
those past their age into ``DIRECTORY/day=2026-12-03/part-*.parquet`` (this module); ``modgate decisions
export`` reads both. The frame itself is never stored: its SHA-256 names it. docs/decisions.md maps the
fields onto the statement of reasons of the EU Digital Services Act (Art. 17).

pyarrow (the ``archive`` extra, 170 MB) is imported only where Parquet is written or read, so the rows,
their ids and the summaries import without it.
"""

from __future__ import annotations

import functools
import secrets
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from contracts.actions import Action

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "STREAM_ID",
    "DecisionKind",
    "DecisionRow",
    "TenantDecisions",
    "archive_missing",
    "day_partitions",
    "decision_schema",
    "drop_days_before",
    "labelled_decisions",
    "new_decision_id",
    "read_decisions",
    "stream_id_order",
    "tenant_decisions",
    "write_day_partitions",
]

# judged: the engine judged the frame; reused: a stored verdict answered; escalated: a thinking-on re-ask
# answered; engine_failure: the engine could not answer and the tenant's policy said ``review``; label: a
# person's label of an earlier decision (``automated`` false), appended by the review queue
DecisionKind = Literal["judged", "reused", "escalated", "engine_failure", "label"]


def new_decision_id() -> str:
    """A fresh decision id, one per verdict answered (``dec-`` + 12 hex digits of unix milliseconds + 20
    random ones, so ids sort by time like a UUIDv7): the frames of one packed engine request, a reused
    verdict and the verdict it reuses, an escalated verdict and its fast one each have their own."""
    return f"dec-{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


class DecisionRow(BaseModel):
    """One decision, as the log keeps it (field order is the export's column order)."""

    model_config = ConfigDict(extra="forbid")

    decided_at: datetime
    request_id: str  # the moderation request (``modr-…``); a label names the decision it labels by it
    tenant: str
    frame_sha256: str | None  # null for a text input
    kind: DecisionKind
    automated: bool  # false only for a person's label
    action: Action
    categories: list[str]
    confidence: float | None
    model_action: Action | None = None  # the model's action where the tenant's policy changed it
    moderation_rule: str | None = None  # which rule of the policy changed it
    model: str | None
    model_revision: str | None = None
    prompt_version: str | None
    prompt_sha256: str | None = None
    moderation_policy_version: int | None
    thinking: str | None  # on / off: how the answering verdict was made (null for a label)
    thinking_mode: str | None = None  # on / off / escalate: what the policy chose
    thinking_rule: str | None = None
    engine_request_id: str | None = None
    latency_ms: float | None = None
    labelled_by: str | None = None  # a label's reviewer, as the review audit names them
    # why the verdict was queued for review (review, unsure, audit): on the decision when it was queued (the
    # weekly report counts each stratum's queued items from it), and on the label of its item
    review_reason: str | None = None
    audit_sample_rate: float | None = None  # the audit rate its item was offered at (audit: 1/rate)
    # the verdict's own id (the result's ``modgate.decision_id``); a label: the id of the decision it labels
    decision_id: str | None = None


ARCHIVE_EXTRA_HINT = "the decision archive's Parquet files need pyarrow: pip install 'modgate[archive]'"


def archive_missing() -> str | None:
    """Why this install cannot write or read the archive's Parquet files (None: it can)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return ARCHIVE_EXTRA_HINT
    return None


def _arrow() -> tuple[ModuleType, ModuleType, ModuleType]:
    """pyarrow, its compute and its Parquet modules: imported on the first archive write or read."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(ARCHIVE_EXTRA_HINT) from exc
    return pa, pc, pq


@functools.cache
def decision_schema() -> pa.Schema:
    """The archive's Arrow schema: one column per :class:`DecisionRow` field, in its order."""
    pa = _arrow()[0]
    return pa.schema(
        [
            ("decided_at", pa.timestamp("us", tz="UTC")),
            ("request_id", pa.string()),
            ("tenant", pa.string()),
            ("frame_sha256", pa.string()),
            ("kind", pa.string()),
            ("automated", pa.bool_()),
            ("action", pa.string()),
            ("categories", pa.list_(pa.string())),
            ("confidence", pa.float64()),
            ("model_action", pa.string()),
            ("moderation_rule", pa.string()),
            ("model", pa.string()),
            ("model_revision", pa.string()),
            ("prompt_version", pa.string()),
            ("prompt_sha256", pa.string()),
            ("moderation_policy_version", pa.int64()),
            ("thinking", pa.string()),
            ("thinking_mode", pa.string()),
            ("thinking_rule", pa.string()),
            ("engine_request_id", pa.string()),
            ("latency_ms", pa.float64()),
            ("labelled_by", pa.string()),
            ("review_reason", pa.string()),
            ("audit_sample_rate", pa.float64()),
            ("decision_id", pa.string()),
        ]
    )


# an archived row's stream entry id (null for rows not moved from a stream): an archive run that outlived its
# lock's lease may write entries the next owner writes too; a reader keeps the first row of each entry
STREAM_ID = "stream_id"


def _archive_schema() -> pa.Schema:
    """The archive files' schema: the rows' columns and each row's stream entry id."""
    pa = _arrow()[0]
    return decision_schema().append(pa.field(STREAM_ID, pa.string()))


def _table(rows: Iterable[DecisionRow], stream_ids: Sequence[str] | None) -> pa.Table:
    pa = _arrow()[0]
    records = [row.model_dump(mode="python") for row in rows]
    for record, stream_id in zip(records, stream_ids or (), strict=stream_ids is not None):
        record[STREAM_ID] = stream_id
    return pa.Table.from_pylist(records, schema=_archive_schema())


def _day_dir(directory: Path, day: date) -> Path:
    return directory / f"day={day.isoformat()}"


def day_partitions(directory: Path) -> dict[date, Path]:
    """Every day folder under ``directory``, by day."""
    found: dict[date, Path] = {}
    if directory.is_dir():
        for folder in directory.glob("day=*"):
            try:
                found[date.fromisoformat(folder.name.removeprefix("day="))] = folder
            except ValueError:
                continue
    return dict(sorted(found.items()))


# a part file's metadata: the first stream entry of the archive run that wrote it (see read_decisions)
FIRST_STREAM_ID = b"modgate.first_stream_id"


def stream_id_order(entry_id: str) -> tuple[int, int]:
    """A Redis stream entry id (``1733212800000-3``) as a value that sorts as the stream does."""
    millis, _, sequence = entry_id.partition("-")
    return int(millis), int(sequence or 0)


def write_day_partitions(
    rows: Iterable[DecisionRow], directory: Path, first_stream_id: str | None = None,
    stream_ids: Sequence[str] | None = None,
) -> list[Path]:
    """Append rows to the Parquet folders of their UTC days (new part files only, written under a temporary
    name and renamed, so a reader never sees half a file); returns the files written. ``first_stream_id``:
    the first stream entry the rows were moved from, kept in each file's metadata; ``stream_ids``: each
    row's own entry, kept beside it (:data:`STREAM_ID`)."""
    _, pc, pq = _arrow()
    table = _table(rows, stream_ids)
    if first_stream_id is not None:
        table = table.replace_schema_metadata({FIRST_STREAM_ID: first_stream_id.encode()})
    written: list[Path] = []
    if table.num_rows == 0:
        return written
    days = pc.strftime(table["decided_at"], format="%Y-%m-%d")
    for label in pc.unique(days).to_pylist():
        part = table.filter(pc.equal(days, label))
        folder = _day_dir(directory, date.fromisoformat(label))
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        path = folder / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet.tmp"
        pq.write_table(part, path, compression="zstd")
        final = path.with_suffix("")  # drop ".tmp"
        path.replace(final)
        written.append(final)
    return written


def _moved_before(path: Path, live_from: str) -> bool:
    """Whether ``path`` holds entries moved off the stream before its first entry was ``live_from``."""
    pq = _arrow()[2]
    first = (pq.read_schema(path).metadata or {}).get(FIRST_STREAM_ID)
    return first is None or stream_id_order(first.decode()) < stream_id_order(live_from)


def read_decisions(
    directory: Path, since: datetime, tenant: str | None = None, live_from: str | None = None
) -> Iterator[DecisionRow]:
    """Rows decided at or after ``since`` (of ``tenant`` only, if given), day by day, each day in order.

    ``live_from``: the first entry the stream held when its rows were read (an export reads the stream
    first). Files an archive run wrote from that entry on are skipped: their rows were on the stream then.
    An archive run moves a prefix of the stream, so a run's files are either all before the live read
    (moved, trimmed) or all from it on (read live): no row is missed or read twice. A stream entry archived
    twice (a run that outlived its lease, beside the next owner's) is read once.
    """
    seen: set[str] = set()
    for day, folder in day_partitions(directory).items():
        if day < since.astimezone(UTC).date():
            continue
        files = sorted(path for path in folder.glob("part-*.parquet")
                       if live_from is None or _moved_before(path, live_from))
        if not files:
            continue
        pa, pc, pq = _arrow()
        table = pa.concat_tables([pq.read_table(path, schema=_archive_schema()) for path in files])
        keep = pc.greater_equal(table["decided_at"], pa.scalar(since, type=pa.timestamp("us", tz="UTC")))
        if tenant is not None:
            keep = pc.and_(keep, pc.equal(table["tenant"], tenant))
        table = table.filter(keep).sort_by("decided_at")
        for row in table.to_pylist():
            stream_id = row.pop(STREAM_ID)
            if stream_id is not None:
                if stream_id in seen:
                    continue
                seen.add(stream_id)
            yield DecisionRow.model_validate(row)


def drop_days_before(directory: Path, keep_days: int, now: datetime | None = None) -> list[date]:
    """Delete the day folders older than ``keep_days`` (the retention setting); returns the days deleted."""
    horizon = ((now or datetime.now(UTC)) - timedelta(days=keep_days)).date()
    dropped = [day for day in day_partitions(directory) if day < horizon]
    for day in dropped:
        shutil.rmtree(_day_dir(directory, day))
    return dropped


class TenantDecisions(BaseModel):
    """One tenant's decisions over a period: how many, what they answered, and how people's labels agreed."""

    tenant: str
    decisions: int  # the gateway's (labels not counted)
    block_share: float | None
    review_share: float | None
    changed_by_policy: int  # the tenant's policy answered other than the model
    engine_failures: int
    labelled: int  # decisions a person labelled afterwards
    label_agreement: float | None  # of their labels (all of a decision labelled twice), the share whose
    # action is the decision's


def labelled_decisions(
    rows: Iterable[DecisionRow],
) -> tuple[list[DecisionRow], list[tuple[DecisionRow, DecisionRow]]]:
    """The gateway's decisions, and each label beside the decision it labels (every label: a decision two
    reviewers labelled is in two pairs).

    A label names its decision by ``decision_id``. A row written before decisions had ids names it by the
    engine request that made it (``engine_request_id``) or else by its request and frame; the latest
    decision before it of that name wins.
    """
    decided: list[DecisionRow] = []
    by_id: dict[tuple[str, str], DecisionRow] = {}
    by_engine: dict[tuple[str, str], DecisionRow] = {}
    by_request: dict[tuple[str, str, str | None], DecisionRow] = {}
    labels: list[DecisionRow] = []
    for row in rows:
        if row.kind == "label":
            labels.append(row)
            continue
        decided.append(row)
        if row.decision_id is not None:
            by_id[(row.tenant, row.decision_id)] = row
        by_request[(row.tenant, row.request_id, row.frame_sha256)] = row
        if row.engine_request_id is not None:
            by_engine[(row.tenant, row.engine_request_id)] = row
    pairs: list[tuple[DecisionRow, DecisionRow]] = []
    for label in labels:
        if label.decision_id is not None:
            decision = by_id.get((label.tenant, label.decision_id))
        elif label.engine_request_id is not None:
            decision = by_engine.get((label.tenant, label.engine_request_id))
        else:
            decision = by_request.get((label.tenant, label.request_id, label.frame_sha256))
        if decision is not None:
            pairs.append((decision, label))
    return decided, pairs


def tenant_decisions(rows: Iterable[DecisionRow]) -> list[TenantDecisions]:
    """Per tenant, by name: counts and shares of the gateway's decisions and the labels' agreement with them
    (:func:`labelled_decisions` matches a label to its decision)."""
    decided, pairs = labelled_decisions(rows)
    by_tenant: dict[str, list[DecisionRow]] = {}
    for row in decided:
        by_tenant.setdefault(row.tenant, []).append(row)
    summaries = []
    for tenant in sorted(by_tenant.keys() | {label.tenant for _, label in pairs}):
        mine = by_tenant.get(tenant, [])
        matched = [(row, label) for row, label in pairs if row.tenant == tenant]
        total = len(mine)
        summaries.append(TenantDecisions(
            tenant=tenant,
            decisions=total,
            block_share=sum(row.action == "block" for row in mine) / total if total else None,
            review_share=sum(row.action == "review" for row in mine) / total if total else None,
            changed_by_policy=sum(row.model_action is not None for row in mine),
            engine_failures=sum(row.kind == "engine_failure" for row in mine),
            labelled=len({id(row) for row, _ in matched}),
            label_agreement=(sum(row.action == label.action for row, label in matched) / len(matched)
                             if matched else None),
        ))
    return summaries
