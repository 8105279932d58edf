"""An export is one consistent cut of the decision log while replicas archive, and the archive lock is
released only by the replica that holds it (real Redis)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

import gateway.decisions.log as decision_log
from contracts.decisions import DecisionRow
from gateway.decisions.log import RedisDecisionLog, export_rows
from gateway.http.services import redis_client
from gateway.settings import DecisionSettings

STREAM = "test:cut:decisions"


def decision(number: int) -> DecisionRow:
    at = datetime.now(UTC) - timedelta(minutes=10) + timedelta(seconds=number)
    return DecisionRow(
        decided_at=at, request_id=f"modr-{number}", tenant="news", frame_sha256=f"{number:064x}",
        kind="judged", automated=True, action="block", categories=["violence"], confidence=0.9, model="m",
        prompt_version="v2", moderation_policy_version=1, thinking="off",
    )


class ArchiveBetweenReads:
    """Another replica's archive run, started as the export begins the second of its two reads (the live
    stream's and the archive directory's, in whichever order the export makes them)."""

    def __init__(self, replica: RedisDecisionLog, loop: asyncio.AbstractEventLoop) -> None:
        self.replica = replica
        self.loop = loop
        self.reads: list[str] = []
        self.moved: int | None = None

    async def before(self, read: str) -> None:
        self.reads.append(read)
        if len(self.reads) == 2:
            self.moved = await self.replica.archive()

    def wrap_archive_read(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def reading(*args: Any, **kwargs: Any) -> Any:  # on the export's worker thread
            asyncio.run_coroutine_threadsafe(self.before("archive"), self.loop).result()
            return read(*args, **kwargs)
        return reading


class ExportersLog(RedisDecisionLog):
    """The exporting process's view of the log; its live read tells the archive run where it is."""

    midway: ArchiveBetweenReads

    async def live(self, since: datetime, tenant: str | None = None) -> Any:
        await self.midway.before("live")
        return await super().live(since, tenant)


def test_an_archive_run_between_the_exports_two_reads_leaves_every_row_exported_once(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = DecisionSettings(stream=STREAM, archive_dir=tmp_path, archive_after_s=0)
    rows = [decision(number) for number in range(6)]

    async def scenario() -> tuple[list[DecisionRow], ArchiveBetweenReads]:
        client = redis_client(redis_url)
        try:
            replica = RedisDecisionLog(client, settings)
            await replica.append(rows[:2])
            assert await replica.archive() == 2  # an earlier run: two rows are in Parquet already
            await replica.append(rows[2:])
            midway = ArchiveBetweenReads(replica, asyncio.get_running_loop())
            monkeypatch.setattr(decision_log, "read_decisions", midway.wrap_archive_read(
                decision_log.read_decisions))
            exporter = ExportersLog(client, settings)
            exporter.midway = midway
            exported = await export_rows(exporter, tmp_path, rows[0].decided_at - timedelta(seconds=1))
            return exported, midway
        finally:
            await client.aclose()

    exported, midway = asyncio.run(scenario())
    assert sorted(midway.reads) == ["archive", "live"]
    assert midway.moved == 4  # the run in the middle moved every row still on the stream
    assert [row.request_id for row in exported] == [row.request_id for row in rows]


def test_an_archive_run_whose_lease_ran_out_leaves_the_next_owners_lock_alone(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = DecisionSettings(stream=STREAM, archive_dir=tmp_path, archive_after_s=0)
    lock = f"{STREAM}:archiver"
    other = redis.Redis.from_url(redis_url)
    write_files = decision_log._archive_files

    def slow_run(*args: Any) -> None:  # the lease runs out while the files are written; replica B takes it
        other.set(lock, "replica-b-token", px=60_000)
        write_files(*args)

    monkeypatch.setattr(decision_log, "_archive_files", slow_run)

    async def archive() -> int:
        client = redis_client(redis_url)
        try:
            replica_a = RedisDecisionLog(client, settings)
            await replica_a.append([decision(1)])
            return await replica_a.archive()
        finally:
            await client.aclose()

    try:
        assert asyncio.run(archive()) == 1
        assert other.get(lock) == b"replica-b-token"
    finally:
        other.close()


def archive_with_a_slow_first_run(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, lease_lapses: bool
) -> tuple[int, int, list[DecisionRow], list[DecisionRow]]:
    """Replica A archives 10 decisions under a 1-s lease and writes its files slowly; meanwhile replica B
    (another process: its own client and loop) runs an archive. ``lease_lapses``: A's lease runs out while it
    writes (a pause longer than the lease, played by deleting its lock). Returns what A and B moved, the
    decisions written and what an export reads."""
    settings = DecisionSettings(stream=STREAM, archive_dir=tmp_path, archive_after_s=0)
    other = redis.Redis.from_url(redis_url)
    write_files = decision_log._archive_files
    moved_by_b: list[int] = []
    first_writer: dict[str, threading.Thread] = {}

    async def replica_b_archive() -> int:
        client = redis_client(redis_url)
        try:
            return await RedisDecisionLog(client, settings, archive_lease_s=1.0).archive()
        finally:
            await client.aclose()

    def slow_run(*args: Any) -> None:  # on A's worker thread
        if threading.current_thread() is not first_writer.setdefault("thread", threading.current_thread()):
            write_files(*args)  # B's own run writes at its pace
            return
        if lease_lapses:
            other.delete(f"{STREAM}:archiver")
        else:
            time.sleep(2.0)  # twice the lease: A renews it meanwhile
        moved_by_b.append(asyncio.run(replica_b_archive()))
        write_files(*args)

    monkeypatch.setattr(decision_log, "_archive_files", slow_run)
    rows = [decision(number) for number in range(10)]

    async def scenario() -> tuple[int, list[DecisionRow]]:
        client = redis_client(redis_url)
        try:
            replica_a = RedisDecisionLog(client, settings, archive_lease_s=1.0)
            await replica_a.append(rows)
            moved = await replica_a.archive()
            return moved, await export_rows(replica_a, tmp_path, rows[0].decided_at - timedelta(seconds=1))
        finally:
            await client.aclose()

    try:
        moved_by_a, exported = asyncio.run(scenario())
    finally:
        other.close()
    return moved_by_a, moved_by_b[0], rows, exported


def test_an_archive_run_slower_than_its_lease_keeps_the_lock_and_exports_each_decision_once(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved_by_a, moved_by_b, rows, exported = archive_with_a_slow_first_run(
        redis_url, tmp_path, monkeypatch, lease_lapses=False)
    assert (moved_by_a, moved_by_b) == (10, 0)  # A extended its lease while it worked: B found it held
    assert [row.request_id for row in exported] == [row.request_id for row in rows]


def test_entries_archived_twice_after_a_lease_ran_out_are_exported_once(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved_by_a, moved_by_b, rows, exported = archive_with_a_slow_first_run(
        redis_url, tmp_path, monkeypatch, lease_lapses=True)
    assert moved_by_b == 10  # B took the lapsed lock and archived the same entries
    assert moved_by_a == 10  # A's files were written before it could know; it did not trim after
    assert len(list(tmp_path.glob("day=*/part-*.parquet"))) >= 2  # both copies are on disk
    assert [row.request_id for row in exported] == [row.request_id for row in rows]
