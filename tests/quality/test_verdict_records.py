"""Verdict records: validation, ISO weeks, pairing, and the JSONL and Redis stores."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from contracts.records import (
    JsonlRecordStore,
    MirroredRecordStore,
    RedisRecordStore,
    VerdictRecord,
    pair_records,
    parse_iso_week,
    week_bounds,
)


def record(
    frame: str = "a", arm: str = "thinking_on", *, at: datetime | None = None, **changes: Any
) -> VerdictRecord:
    fields: dict[str, Any] = {
        "frame_sha256": hashlib.sha256(frame.encode()).hexdigest(),
        "video_id": "video-1",
        "tenant": "acme",
        "arm": arm,
        "action": "allow",
        "flagged": False,
        "categories": [],
        "policy_version": 3,
        "prompt_tokens": 1076,
        "cached_tokens": 0,
        "completion_tokens": 95,
        "reasoning_tokens": 88,
        "latency_ms": 8560.0,
        "ttft_ms": 468.0,
        "recorded_at": at or datetime(2026, 11, 25, 12, 0, tzinfo=UTC),
        "source": "shadow",
        "request_id": f"req-{frame}-{arm}",
    }
    fields.update(changes)
    return VerdictRecord(**fields)


def test_a_record_keeps_its_time_in_utc() -> None:
    from zoneinfo import ZoneInfo

    local = datetime(2026, 11, 30, 7, 30, tzinfo=ZoneInfo("Asia/Shanghai"))  # Sunday 23:30 UTC
    converted = record(at=local)
    assert converted.recorded_at.tzinfo == UTC
    assert converted.iso_week == (2026, 48)


def test_a_record_without_a_timezone_is_refused() -> None:
    with pytest.raises(ValidationError):
        record(at=datetime(2026, 11, 25, 12, 0))  # naive on purpose


def test_a_record_with_an_unknown_arm_is_refused() -> None:
    with pytest.raises(ValidationError):
        record(arm="thinking_maybe")


def test_iso_weeks_parse_and_bound_correctly() -> None:
    assert parse_iso_week("2026-W48") == (2026, 48)
    assert parse_iso_week("2026-w01") == (2026, 1)
    start, end = week_bounds(2026, 48)
    assert start == datetime(2026, 11, 23, tzinfo=UTC)
    assert end - start == timedelta(days=7)
    for bad in ("2026-48", "2026-W54", "last week"):
        with pytest.raises(ValueError, match="ISO week"):
            parse_iso_week(bad)


# --- pairing -------------------------------------------------------------------------------------------


def test_records_pair_by_frame_and_policy_version() -> None:
    records = [
        record("a", "thinking_on"),
        record("a", "thinking_off", flagged=True, action="block"),
        record("b", "thinking_on"),
        record("b", "thinking_off", policy_version=4),  # another policy: no partner
        record("c", "thinking_off"),
    ]
    pairing = pair_records(records)
    assert [(p.frame_sha256, p.candidate.flagged) for p in pairing.pairs] == [(records[0].frame_sha256, True)]
    assert pairing.unpaired_reference == 1
    assert pairing.unpaired_candidate == 2


def test_the_first_verdict_of_a_frame_and_arm_wins() -> None:
    early = datetime(2026, 11, 24, tzinfo=UTC)
    records = [
        record("a", "thinking_off", at=early + timedelta(hours=2), flagged=True, action="block"),
        record("a", "thinking_off", at=early + timedelta(hours=1)),
        record("a", "thinking_on", at=early),
    ]
    pairing = pair_records(records)
    assert len(pairing.pairs) == 1
    assert pairing.pairs[0].candidate.flagged is False
    assert pairing.duplicates == 1


def test_cached_reruns_are_left_out_of_the_noise_floor() -> None:
    records = [
        record("a"),
        record("a", "thinking_on_rerun", reused=True),
        record("b"),
        record("b", "thinking_on_rerun"),
    ]
    pairing = pair_records(records, "thinking_on", "thinking_on_rerun", skip_reused_candidates=True)
    assert len(pairing.pairs) == 1
    assert pairing.reused_candidates == 1


# --- JSONL store ----------------------------------------------------------------------------------------


async def test_jsonl_store_writes_one_file_per_iso_week_and_reads_a_week_back(tmp_path: Path) -> None:
    store = JsonlRecordStore(tmp_path)
    monday = datetime(2026, 11, 23, 0, 0, 1, tzinfo=UTC)
    sunday_before = monday - timedelta(seconds=2)
    await store.append(record("a", at=monday))
    await store.append(record("b", at=sunday_before))
    await store.append(record("c", at=monday + timedelta(days=6, hours=23)))
    await store.aclose()
    assert [store.path_for(2026, 47).name, store.path_for(2026, 48).name] == [
        "records-2026-W47.jsonl",
        "records-2026-W48.jsonl",
    ]
    assert len(await reopened_week_files(tmp_path)) == 2
    reopened = JsonlRecordStore(tmp_path)
    week = await reopened.read_week(2026, 48)
    assert [r.request_id for r in week] == ["req-a-thinking_on", "req-c-thinking_on"]
    assert len(await reopened.read_range(None, None)) == 3


async def reopened_week_files(directory: Path) -> list[Path]:
    return await asyncio.to_thread(lambda: sorted(directory.glob("records-*.jsonl")))


def cut_last_line_short(path: Path) -> None:
    """What a crash in the middle of a write leaves behind."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"frame_sha256": "trunc')


async def test_jsonl_store_survives_a_line_cut_short_by_a_crash(tmp_path: Path) -> None:
    store = JsonlRecordStore(tmp_path)
    await store.append(record("a"))
    await store.aclose()
    cut_last_line_short(store.path_for(2026, 48))
    again = JsonlRecordStore(tmp_path)
    await again.append(record("b"))
    await again.aclose()
    week = await JsonlRecordStore(tmp_path).read_week(2026, 48)
    assert [r.request_id for r in week] == ["req-a-thinking_on", "req-b-thinking_on"]


async def test_jsonl_store_reads_back_what_it_has_not_closed_yet(tmp_path: Path) -> None:
    store = JsonlRecordStore(tmp_path)
    await store.append(record("a"))
    assert len(await store.read_week(2026, 48)) == 1
    await store.aclose()


# --- Redis store -----------------------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_store_reads_a_week_by_stream_time_and_record_time(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        store = RedisRecordStore(client, stream="modgate:quality:test", page_size=2)
        now = datetime.now(UTC)
        year, week, _ = now.isocalendar()
        start, _ = week_bounds(year, week)
        inside = [record(str(i), at=start + (now - start) * (i / 10)) for i in range(5)]
        before = record("old", at=start - timedelta(seconds=1))
        for item in [*inside, before]:
            await store.append(item)
        found = await store.read_week(year, week)
        assert sorted(r.request_id for r in found) == sorted(r.request_id for r in inside)
        assert await store.read_week(year - 1, 10) == []
        assert await client.xlen("modgate:quality:test") == 6
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_redis_stream_is_trimmed_to_about_maxlen(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        store = RedisRecordStore(client, stream="modgate:quality:trim", maxlen=100)
        for i in range(400):
            await store.append(record(str(i), at=datetime.now(UTC)))
        length = await client.xlen("modgate:quality:trim")
        assert 100 <= length < 400  # approximate trimming works in whole macro-nodes
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_mirrored_store_writes_both_and_reads_the_files(tmp_path: Path, redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        redis_store = RedisRecordStore(client, stream="modgate:quality:mirror")
        store = MirroredRecordStore(JsonlRecordStore(tmp_path), redis_store)
        item = record("m", at=datetime.now(UTC))
        await store.append(item)
        assert await store.read_range(None, None) == [item]
        assert await redis_store.read_range(None, None) == [item]
        await store.aclose()
    finally:
        await client.aclose()
