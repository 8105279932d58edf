"""Verdict records (one arm's verdict on one frame), their stores, and pairing by frame.

A week of records must survive restarts, so records go to append-only JSONL files (one per ISO week),
a Redis stream, or both. Both stores partition by the record's own `recorded_at`, so a report on
week 48 reads the same records whichever store holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator
from redis.asyncio import Redis

from contracts.actions import Action

__all__ = [
    "ARMS",
    "ARM_SETTINGS",
    "Arm",
    "HumanLabel",
    "JsonlRecordStore",
    "MirroredRecordStore",
    "PairedRecord",
    "Pairing",
    "RecordStore",
    "RedisRecordStore",
    "Selection",
    "Source",
    "VerdictRecord",
    "arm_for",
    "iso_week_of",
    "pair_records",
    "parse_iso_week",
    "week_bounds",
]

logger = logging.getLogger(__name__)

# An arm is a thinking mode and a verdict format: the plain names ask for the compact verdict (the
# default), the ``_json`` ones for the JSON object, so operators can measure one format against the other.
Arm = Literal["thinking_on", "thinking_off", "thinking_on_rerun", "thinking_off_json", "thinking_on_json"]
Source = Literal["shadow", "offline"]
# How a live frame came to be judged in both modes: a random share (shadow sampling), or because its fast
# verdict was unsure and escalated (not a random sample: weight it by `selection_probability`, or leave
# it out).
Selection = Literal["random", "escalation"]
ARMS: tuple[Arm, ...] = (
    "thinking_on",
    "thinking_off",
    "thinking_on_rerun",
    "thinking_off_json",
    "thinking_on_json",
)
ARM_SETTINGS: dict[Arm, tuple[Literal["on", "off"], Literal["compact", "json"]]] = {
    "thinking_on": ("on", "compact"),
    "thinking_off": ("off", "compact"),
    "thinking_on_rerun": ("on", "compact"),
    "thinking_off_json": ("off", "json"),
    "thinking_on_json": ("on", "json"),
}


def arm_for(mode: Literal["on", "off"], verdict_format: Literal["compact", "json"]) -> Arm:
    """The arm of a thinking mode and verdict format (never the re-run arm: only the runner makes those)."""
    return next(arm for arm, settings in ARM_SETTINGS.items() if settings == (mode, verdict_format))


class HumanLabel(BaseModel):
    """A person's judgement of a frame; `action` is absent when the label was only flagged 0/1."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    flagged: bool
    action: Action | None = None


class VerdictRecord(BaseModel):
    """One arm's verdict on one frame, as the gateway (shadow) or the offline runner saw it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    frame_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    video_id: str | None = None
    tenant: str
    arm: Arm
    action: Action
    flagged: bool
    categories: list[str] = Field(default_factory=list)
    policy_version: int = Field(ge=0)
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    reasoning_tokens: int = Field(ge=0)
    latency_ms: float = Field(ge=0)
    ttft_ms: float | None = Field(default=None, ge=0)
    recorded_at: AwareDatetime
    source: Source
    request_id: str
    # project-only, optional: what the runner needs to resume and to score against people
    reused: bool = False  # the gateway answered from its verdict cache: not an independent run
    input_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")  # bytes the runner sent
    human_label: HumanLabel | None = None
    confidence: float | None = Field(default=None, ge=0, le=1)  # P(action) from the engine's logprobs
    selection: Selection | None = None  # None: an offline run, every frame of the data set
    # the chance this frame was paired at all, given its fast verdict (1 for an escalation below the
    # threshold, the shadow share for a random pair): inverse-probability weights use it
    selection_probability: float | None = Field(default=None, gt=0, le=1)
    engine: str = (
        "vllm"  # the kind of engine that judged it (vllm or llamacpp): an arm beside mode and format
    )

    @field_validator("recorded_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @property
    def iso_week(self) -> tuple[int, int]:
        return iso_week_of(self.recorded_at)


class PairedRecord(BaseModel):
    """The same frame under one policy version, judged by the reference and the candidate arm."""

    model_config = ConfigDict(frozen=True)

    frame_sha256: str
    policy_version: int
    reference: VerdictRecord
    candidate: VerdictRecord

    @property
    def video_id(self) -> str | None:
        return self.reference.video_id or self.candidate.video_id

    @property
    def tenant(self) -> str:
        return self.reference.tenant

    @property
    def human_label(self) -> HumanLabel | None:
        return self.reference.human_label or self.candidate.human_label


# --- ISO weeks ---------------------------------------------------------------------------------------


def iso_week_of(moment: datetime) -> tuple[int, int]:
    year, week, _ = moment.astimezone(UTC).isocalendar()
    return year, week


def week_bounds(year: int, week: int) -> tuple[datetime, datetime]:
    """[Monday 00:00 UTC, next Monday 00:00 UTC) of an ISO week."""
    start = datetime.combine(date.fromisocalendar(year, week, 1), datetime.min.time(), tzinfo=UTC)
    return start, start + timedelta(days=7)


def parse_iso_week(text: str) -> tuple[int, int]:
    """`2026-W48` -> (2026, 48); raises ValueError with the expected form otherwise."""
    try:
        year_text, week_text = text.strip().upper().split("-W")
        year, week = int(year_text), int(week_text)
        date.fromisocalendar(year, week, 1)
    except ValueError as exc:
        raise ValueError(f"expected an ISO week like 2026-W48, got {text!r}") from exc
    return year, week


def format_iso_week(year: int, week: int) -> str:
    return f"{year}-W{week:02d}"


# --- pairing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pairing:
    """Pairs plus what did not pair, so a report can say how much of the week it covers."""

    pairs: list[PairedRecord]
    unpaired_reference: int = 0
    unpaired_candidate: int = 0
    duplicates: int = 0
    reused_candidates: int = 0
    notes: list[str] = field(default_factory=list)


def pair_records(
    records: Iterable[VerdictRecord],
    reference: Arm = "thinking_on",
    candidate: Arm = "thinking_off",
    *,
    skip_reused_candidates: bool = False,
) -> Pairing:
    """Pair the two arms' records by frame_sha256 + policy_version; the first record of each arm wins.

    A frame seen twice in a week (shadow sampling twice, an offline run repeated) counts once, so
    popular frames do not weigh more. `skip_reused_candidates` drops candidate verdicts answered from
    the gateway's cache: a cached thinking-on verdict is no re-run, and would fake a perfect noise floor.
    """
    first: dict[tuple[Arm, str, int], VerdictRecord] = {}
    duplicates = reused = 0
    for record in sorted(records, key=lambda r: r.recorded_at):
        if record.arm not in (reference, candidate):
            continue
        if skip_reused_candidates and record.arm == candidate and record.reused:
            reused += 1
            continue
        key = (record.arm, record.frame_sha256, record.policy_version)
        if key in first:
            duplicates += 1
        else:
            first[key] = record
    pairs: list[PairedRecord] = []
    unpaired_reference = 0
    matched_candidates = 0
    for (arm, frame, version), ref_record in first.items():
        if arm != reference:
            continue
        cand_record = first.get((candidate, frame, version))
        if cand_record is None:
            unpaired_reference += 1
            continue
        matched_candidates += 1
        pairs.append(
            PairedRecord(
                frame_sha256=frame, policy_version=version, reference=ref_record, candidate=cand_record
            )
        )
    total_candidates = sum(1 for arm, _, _ in first if arm == candidate)
    return Pairing(
        pairs=pairs,
        unpaired_reference=unpaired_reference,
        unpaired_candidate=total_candidates - matched_candidates,
        duplicates=duplicates,
        reused_candidates=reused,
    )


# --- stores ------------------------------------------------------------------------------------------


class RecordStore(Protocol):
    """Where verdict records live: append one, read back an ISO week or a time range."""

    async def append(self, record: VerdictRecord) -> None: ...

    async def read_week(self, year: int, week: int) -> list[VerdictRecord]: ...

    async def read_range(self, start: datetime | None, end: datetime | None) -> list[VerdictRecord]: ...

    async def aclose(self) -> None: ...


def _parse_line(line: str, origin: str) -> VerdictRecord | None:
    try:
        return VerdictRecord.model_validate_json(line)
    except ValidationError:
        # A line cut short by a crash, or written by a newer version: skip it, say so, keep the rest.
        logger.warning("skipping an unreadable quality record in %s", origin)
        return None


def _in_range(record: VerdictRecord, start: datetime | None, end: datetime | None) -> bool:
    return (start is None or record.recorded_at >= start) and (end is None or record.recorded_at < end)


class JsonlRecordStore:
    """Append-only JSONL files, one per ISO week of `recorded_at`: `records-2026-W48.jsonl`.

    Each append writes one line and flushes it to the OS; files are fsynced on close. Lines are small
    and opened with O_APPEND, so a gateway and an offline run may append to the same directory.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files: dict[tuple[int, int], IO[str]] = {}

    def path_for(self, year: int, week: int) -> Path:
        return self.directory / f"records-{format_iso_week(year, week)}.jsonl"

    def _file_for(self, year: int, week: int) -> IO[str]:
        handle = self._files.get((year, week))
        if handle is None:
            path = self.path_for(year, week)
            needs_newline = False
            if path.exists() and path.stat().st_size > 0:
                with path.open("rb") as existing:
                    existing.seek(-1, os.SEEK_END)
                    needs_newline = existing.read(1) != b"\n"
            handle = path.open("a", encoding="utf-8")
            if needs_newline:
                # the last writer died mid-line: end that line so ours stays readable
                handle.write("\n")
            self._files[(year, week)] = handle
        return handle

    def append_sync(self, record: VerdictRecord) -> None:
        handle = self._file_for(*record.iso_week)
        handle.write(record.model_dump_json() + "\n")
        handle.flush()

    async def append(self, record: VerdictRecord) -> None:
        # One short buffered write and a flush: cheaper than a thread hop.
        self.append_sync(record)

    def _flush_open(self) -> None:
        for handle in self._files.values():
            handle.flush()

    def read_week_sync(self, year: int, week: int) -> list[VerdictRecord]:
        self._flush_open()
        path = self.path_for(year, week)
        if not path.exists():
            return []
        start, end = week_bounds(year, week)
        records = []
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                record = _parse_line(line, str(path)) if line.strip() else None
                if record is not None and _in_range(record, start, end):
                    records.append(record)
        return records

    def read_range_sync(self, start: datetime | None, end: datetime | None) -> list[VerdictRecord]:
        weeks = []
        for path in sorted(self.directory.glob("records-*.jsonl")):
            try:
                year, week = parse_iso_week(path.stem.removeprefix("records-"))
            except ValueError:
                continue
            week_start, week_end = week_bounds(year, week)
            if (start is None or week_end > start) and (end is None or week_start < end):
                weeks.append((year, week))
        found = (r for year, week in weeks for r in self.read_week_sync(year, week))
        return [r for r in found if _in_range(r, start, end)]

    async def read_week(self, year: int, week: int) -> list[VerdictRecord]:
        return await asyncio.to_thread(self.read_week_sync, year, week)

    async def read_range(self, start: datetime | None, end: datetime | None) -> list[VerdictRecord]:
        return await asyncio.to_thread(self.read_range_sync, start, end)

    def close(self) -> None:
        files, self._files = self._files, {}
        for handle in files.values():
            with contextlib.suppress(OSError):
                handle.flush()
                os.fsync(handle.fileno())
            handle.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> JsonlRecordStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class RedisRecordStore:
    """A Redis stream of records (XADD, trimmed to about `maxlen`), read back by stream-id time range.

    Stream ids are the server's millisecond clock at XADD, so a week is read by id range with a margin
    either side (clock skew, slow writers) and then filtered by each record's own `recorded_at`.
    The client belongs to the caller, who closes it.
    """

    def __init__(
        self,
        redis: Redis,
        stream: str = "modgate:quality:records",
        maxlen: int = 1_000_000,
        *,
        margin: timedelta = timedelta(hours=1),
        page_size: int = 5_000,
    ) -> None:
        self.redis = redis
        self.stream = stream
        self.maxlen = maxlen
        self.margin = margin
        self.page_size = page_size

    async def append(self, record: VerdictRecord) -> None:
        await self.redis.xadd(
            self.stream, {"record": record.model_dump_json()}, maxlen=self.maxlen, approximate=True
        )

    async def read_week(self, year: int, week: int) -> list[VerdictRecord]:
        return await self.read_range(*week_bounds(year, week))

    async def read_range(self, start: datetime | None, end: datetime | None) -> list[VerdictRecord]:
        return [record async for page in self.pages(start, end) for record in page]

    async def pages(self, start: datetime | None, end: datetime | None) -> AsyncIterator[list[VerdictRecord]]:
        """The records of a time range a page (`page_size` stream entries) at a time."""
        low = "-" if start is None else f"{max(0, int((start - self.margin).timestamp() * 1000))}-0"
        high = "+" if end is None else f"{int((end + self.margin).timestamp() * 1000)}"
        while True:
            entries = await self.redis.xrange(self.stream, min=low, max=high, count=self.page_size) or []
            records: list[VerdictRecord] = []
            for _, fields in entries:
                raw = (fields or {}).get(b"record", (fields or {}).get("record"))
                if raw is None:
                    continue
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                record = _parse_line(text, f"redis stream {self.stream}")
                if record is not None and _in_range(record, start, end):
                    records.append(record)
            yield records
            if len(entries) < self.page_size:
                return
            last_id: Any = entries[-1][0]
            low = "(" + (last_id.decode() if isinstance(last_id, bytes) else str(last_id))

    async def aclose(self) -> None:
        """Nothing to release: the Redis client is the caller's."""


class MirroredRecordStore:
    """Writes to every store, reads from the first: files as the durable copy, Redis for the fleet."""

    def __init__(self, primary: RecordStore, *mirrors: RecordStore) -> None:
        self.primary = primary
        self.mirrors = mirrors

    async def append(self, record: VerdictRecord) -> None:
        await self.primary.append(record)
        for mirror in self.mirrors:
            await mirror.append(record)

    async def read_week(self, year: int, week: int) -> list[VerdictRecord]:
        return await self.primary.read_week(year, week)

    async def read_range(self, start: datetime | None, end: datetime | None) -> list[VerdictRecord]:
        return await self.primary.read_range(start, end)

    async def aclose(self) -> None:
        for store in (self.primary, *self.mirrors):
            await store.aclose()
