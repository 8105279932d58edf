"""Where decisions are kept: a Redis stream shared by every replica (or this process's memory), trimmed by
age into daily Parquet files, which are deleted after the retention period.

Redis layout (``<stream>`` is ``MODGATE_DECISIONS__STREAM``):
- ``<stream>``: one entry per decision, field ``row`` (the row's JSON); the entry id's time is the append's.
- ``<stream>:archiver``: a lock (redis-py's ``Lock``: a token of its owner, released only by it) so one
  replica at a time moves entries to Parquet; a replica whose lease ran out leaves the next owner's alone.

An export reads the stream first, then the Parquet files an archive run wrote before that read (each file
names the first stream entry its run moved): one consistent cut, whatever archive runs in between.

The answer never waits on a failing Redis longer than ``redis_timeout_s``: an append that fails is tried
again in the background (``retry_attempts`` times in all, for at most ``retry_timeout_s``, with stamina's
jittered back-off), and only when every try failed is it logged and counted
(``modgate_decisions_unlogged_total``). The verdict goes out either way.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol

import stamina
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.lock import Lock
from redis.exceptions import LockError, RedisError

from contracts.decisions import DecisionRow, drop_days_before, read_decisions, write_day_partitions
from gateway.settings import DecisionSettings
from gateway.state import run_replicated
from gateway.tasks import stop

log = logging.getLogger("modgate.decisions")
_REDIS_DOWN = (RedisError, OSError, TimeoutError)
_BATCH = 10_000  # stream entries moved to Parquet per read
Unlogged = Callable[[int], None]
"""Told how many rows the log did not take (``GatewayMetrics.not_logged``)."""
_CUT_TRIES = 5  # live reads started again when an archive trimmed the stream under a paged read


@dataclass(frozen=True)
class LiveRows:
    """Rows not yet archived, and the first stream entry when they were read (None: an empty stream or
    memory), which tells an export which archive files hold rows it has already read."""

    rows: list[DecisionRow] = field(default_factory=list)
    first_stream_id: str | None = None


class DecisionLog(Protocol):
    """Appends decisions and reads them back (what is still live, then the archive's days before it)."""

    async def append(self, rows: Iterable[DecisionRow]) -> None:
        """Keep ``rows`` (never raises: a failure is logged and counted)."""
        ...

    async def live(self, since: datetime, tenant: str | None = None) -> LiveRows:
        """Rows not yet moved to Parquet, decided at or after ``since``."""
        ...

    async def archive(self, now: float | None = None) -> int:
        """Move rows older than ``archive_after_s`` into the day files; drop days past retention."""
        ...

    async def flush(self) -> None:
        """Wait until every failed append was stored or counted as unlogged."""
        ...


def _archive_files(
    settings: DecisionSettings, rows: list[DecisionRow], now: float, first_stream_id: str | None = None,
    stream_ids: list[str] | None = None,
) -> None:
    """Write rows to their day folders and drop expired days (on a worker thread: Parquet is CPU)."""
    if rows:
        write_day_partitions(rows, settings.archive_dir, first_stream_id, stream_ids)
    drop_days_before(settings.archive_dir, settings.retention_days, datetime.fromtimestamp(now, UTC))


class MemoryDecisionLog:
    """This process's decisions (``MODGATE_REDIS__URL`` unset): lost on restart until archived."""

    def __init__(self, settings: DecisionSettings, unlogged: Unlogged | None = None) -> None:
        self.settings = settings
        self._rows: deque[tuple[float, DecisionRow]] = deque()
        self._unlogged = unlogged

    async def append(self, rows: Iterable[DecisionRow]) -> None:
        """Keep ``rows`` in memory."""
        now = time.time()
        self._rows.extend((now, row) for row in rows)

    async def flush(self) -> None:
        """Nothing to wait for: memory takes every row."""

    async def live(self, since: datetime, tenant: str | None = None) -> LiveRows:
        """Rows not yet archived (this process's own: nothing archives between its reads)."""
        return LiveRows([row for _, row in self._rows
                         if row.decided_at >= since and (tenant is None or row.tenant == tenant)])

    async def archive(self, now: float | None = None) -> int:
        """Move rows past their age to the day files."""
        now = time.time() if now is None else now
        horizon = now - self.settings.archive_after_s
        moving: list[DecisionRow] = []
        while self._rows and self._rows[0][0] <= horizon:
            moving.append(self._rows.popleft()[1])
        await asyncio.to_thread(_archive_files, self.settings, moving, now)
        return len(moving)


# KEYS: the stream, the batch's key. ARGV: the key's ttl (seconds), then each row's JSON. A batch is added
# once: its key, set in the same run, refuses a second run of it (a retry of a try that did land). The refusal
# still writes (the key's ttl again), so a WAIT after it counts replicas that hold the first run's rows too.
_APPEND_ONCE: Final = """
if not redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[1]) then
  redis.call('EXPIRE', KEYS[2], ARGV[1])
  return 0
end
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', 'row', ARGV[i]) end
return #ARGV - 1
"""


class RedisDecisionLog:
    """Decisions on a Redis stream shared by every replica."""

    def __init__(
        self, client: Redis, settings: DecisionSettings, unlogged: Unlogged | None = None,
        archive_lease_s: float | None = None,
    ) -> None:
        self._redis = client
        self.settings = settings
        self._stream = settings.stream
        self._lock = f"{settings.stream}:archiver"
        # the archive lock's lease, extended while a run works (a run that stops renewing loses it)
        self.archive_lease_s = archive_lease_s or max(60.0, settings.archive_interval_s)
        self._unlogged = unlogged
        self._retrying: set[asyncio.Task[None]] = set()
        self._append_once = client.register_script(_APPEND_ONCE)

    async def _add(self, batch: list[DecisionRow], token: str) -> None:
        """XADD each row in one script run, once per ``token`` (a try that timed out may have landed: a
        stalled Redis runs it when it wakes, and the retry then adds nothing), waiting no longer than
        ``redis_timeout_s``; with ``wait_replicas``, until that many replicas hold it too (fewer in time
        fails the try, and the retry's WAIT covers a first try that landed on the primary alone)."""
        settings = self.settings
        keys = [self._stream, f"{self._stream}:batch:{token}"]
        args = [int(settings.retry_timeout_s * 2 + 60), *(row.model_dump_json() for row in batch)]
        wait_ms = max(1, int(settings.redis_timeout_s * 900))  # WAIT inside the try's own time limit
        async with asyncio.timeout(settings.redis_timeout_s):
            _, holding = await run_replicated(
                self._redis, self._append_once, keys, args, settings.wait_replicas, wait_ms
            )
        if holding < settings.wait_replicas:
            raise ConnectionError(f"{holding} of {settings.wait_replicas} replicas held the rows in time")

    async def append(self, rows: Iterable[DecisionRow]) -> None:
        """XADD each row (one round trip); a failing or hanging Redis costs the answer at most the timeout,
        and the rows are tried again in the background (:meth:`_retry`)."""
        batch = list(rows)
        if not batch:
            return
        token = secrets.token_hex(12)
        try:
            await self._add(batch, token)
        except _REDIS_DOWN as exc:
            log.warning("the decision log did not take %d decision(s), trying again: %s", len(batch), exc,
                        extra={"request_id": batch[0].request_id})
            task = asyncio.create_task(self._retry(batch, token), name="decision-log-retry")
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)

    async def _retry(self, batch: list[DecisionRow], token: str) -> None:
        """Try ``batch`` again with back-off; when every try failed, log it and count it as unlogged."""
        settings = self.settings
        try:
            if settings.retry_attempts <= 1:  # the first try was append's, on the answer's time
                raise ConnectionError("retries are off (MODGATE_DECISIONS__RETRY_ATTEMPTS=1)")
            async for attempt in stamina.retry_context(
                on=_REDIS_DOWN, attempts=settings.retry_attempts - 1,
                timeout=settings.retry_timeout_s, wait_initial=0.1, wait_max=5.0,
            ):
                with attempt:
                    await self._add(batch, token)
        except (*_REDIS_DOWN, asyncio.CancelledError) as exc:
            if self._unlogged is not None:
                self._unlogged(len(batch))
            log.error("the decision log did not take %d decision(s) after %d tries: %s", len(batch),
                      settings.retry_attempts, exc or "the gateway stopped",
                      extra={"request_id": batch[0].request_id})

    async def flush(self) -> None:
        """Wait for the appends being tried again (shutdown, tests): each ends stored or counted."""
        while self._retrying:
            await asyncio.gather(*self._retrying, return_exceptions=True)

    async def close(self, timeout_s: float) -> None:
        """At shutdown: give the appends being tried again ``timeout_s``, then stop them and count their rows
        as unlogged (never dropped silently)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush()
        except TimeoutError:
            await stop(*self._retrying)

    @staticmethod
    def _entries(raw: object) -> list[tuple[str, DecisionRow | None]]:
        """XRANGE's answer as (entry id, row); a row that cannot be read is None (and logged)."""
        entries: list[tuple[str, DecisionRow | None]] = []
        for entry_id, fields in raw if isinstance(raw, list) else []:
            ident = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            value = fields.get(b"row", fields.get("row")) if isinstance(fields, dict) else None
            try:
                entries.append((ident, DecisionRow.model_validate_json(value or b"")))
            except ValidationError:
                log.error("skipping an unreadable decision entry %s: %.200r", ident, value)
                entries.append((ident, None))
        return entries

    async def _first_id(self) -> str | None:
        first = self._entries(await self._redis.xrange(self._stream, min="-", max="+", count=1))
        return first[0][0] if first else None

    async def live(self, since: datetime, tenant: str | None = None) -> LiveRows:
        """Every entry from ``since`` on (the stream id's time is at or after the decision's), with the
        stream's first entry read in the same transaction; a read of several pages that an archive run
        trimmed meanwhile is started again."""
        for _ in range(_CUT_TRIES):
            start = f"{int(since.timestamp() * 1000)}-0"
            pipe = self._redis.pipeline(transaction=True)
            pipe.xrange(self._stream, min="-", max="+", count=1)
            pipe.xrange(self._stream, min=start, max="+", count=_BATCH)
            head, page = await pipe.execute()
            first = self._entries(head)
            first_id = first[0][0] if first else None
            entries = self._entries(page)
            rows = [row for _, row in entries if row is not None]
            paged = len(entries) == _BATCH
            while len(entries) == _BATCH:
                start = f"({entries[-1][0]}"
                entries = self._entries(
                    await self._redis.xrange(self._stream, min=start, max="+", count=_BATCH))
                rows.extend(row for _, row in entries if row is not None)
            if not paged or await self._first_id() == first_id:
                return LiveRows([row for row in rows
                                 if row.decided_at >= since and (tenant is None or row.tenant == tenant)],
                                first_id)
        raise RedisError(f"the stream {self._stream} was trimmed under each of {_CUT_TRIES} reads")

    async def archive(self, now: float | None = None) -> int:
        """Move entries older than ``archive_after_s`` to the day files, then XTRIM them (MINID), under a
        lock whose lease is extended while the run works; the run checks it still owns the lock before it
        writes and before it trims, and each row keeps its stream id, so entries that two owners archived
        anyway (a run that lost its lease in a pause) are read once."""
        now = time.time() if now is None else now
        horizon_ms = int((now - self.settings.archive_after_s) * 1000)
        lock = self._redis.lock(self._lock, timeout=self.archive_lease_s)
        if not await lock.acquire(blocking=False):
            return 0
        renewing = asyncio.create_task(self._renew(lock), name="decision-archive-lease")
        try:
            entries = self._entries(
                await self._redis.xrange(self._stream, min="-", max=f"{horizon_ms}", count=_BATCH * 10)
            )
            readable = [(ident, row) for ident, row in entries if row is not None]
            rows = [row for _, row in readable]
            first_id = entries[0][0] if entries else None
            if not await self._still_owned(lock, "writing"):
                return 0
            await asyncio.to_thread(_archive_files, self.settings, rows, now, first_id,
                                    [ident for ident, _ in readable])
            if entries:  # written first, trimmed after: a crash in between repeats rows, never loses one
                if not await self._still_owned(lock, "trimming"):
                    return len(rows)  # written (a reader drops the next owner's copies), left untrimmed
                last_id = entries[-1][0]
                await self._redis.xtrim(self._stream, minid=last_id, approximate=False)
                await self._redis.xdel(self._stream, last_id)
            return len(rows)
        finally:
            await stop(renewing)
            try:
                await lock.release()
            except LockError:  # the lease ran out and another replica may hold the lock now: it is theirs
                log.warning("the archive lock's lease ran out before the run ended (%s)", self._lock)

    async def _renew(self, lock: Lock) -> None:
        """Extend the lock's lease to a whole lease every third of one while the run works."""
        while True:
            await asyncio.sleep(self.archive_lease_s / 3)
            try:
                await lock.extend(self.archive_lease_s, replace_ttl=True)
            except LockError:
                return  # lost: the run finds out before its next write or trim
            except _REDIS_DOWN as exc:
                log.warning("extending the archive lock failed: %s", exc)

    async def _still_owned(self, lock: Lock, step: str) -> bool:
        """Whether this run still holds the lock, before ``step`` (the lease may have run out in a pause)."""
        if await lock.owned():
            return True
        log.warning("the archive lock's lease ran out; the run stops before %s (%s)", step, self._lock)
        return False


class DecisionArchiver:
    """Calls :meth:`DecisionLog.archive` every ``archive_interval_s`` seconds in the background."""

    def __init__(self, decisions: DecisionLog, interval_s: float) -> None:
        self._decisions = decisions
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop."""
        self._task = asyncio.create_task(self._run(), name="decision-archiver")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                moved = await self._decisions.archive()
            except (*_REDIS_DOWN, OSError) as exc:
                log.warning("moving decisions to the archive failed (next try in %g s): %s",
                            self._interval_s, exc)
                continue
            if moved:
                log.info("moved %d decision(s) to the archive", moved)

    async def stop(self) -> None:
        """Stop the loop."""
        await stop(self._task)


async def export_rows(
    decisions: DecisionLog | None, archive_dir: Path, since: datetime, tenant: str | None = None
) -> list[DecisionRow]:
    """The rows from ``since`` on, in decision order: the live ones, then the archive's written before that
    read (:func:`read_decisions`), so an archive run in between neither loses nor repeats a row."""
    live = LiveRows() if decisions is None else await decisions.live(since, tenant)
    archived = await asyncio.to_thread(
        lambda: list(read_decisions(archive_dir, since, tenant, live.first_stream_id)))
    return sorted([*archived, *live.rows], key=lambda row: row.decided_at)
