"""Durable jobs in Redis: a hash per job, one stream read by every gateway as one consumer group, and Lua
for the steps that must be atomic (see gateway/jobs/__init__.py for why each step is safe)."""

from __future__ import annotations

from typing import Any, Final

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from gateway.errors import StateUnavailable
from gateway.jobs.models import (
    REVIEW_FIELD,
    Delivery,
    JobRecord,
    JobStatus,
    WebhookStatus,
    as_text,
    unix_now,
)
from gateway.stream_store import RedisStreamStore

STREAM: Final = "modgate:jobs"
GROUP: Final = "gateways"

# Atomic steps, as Lua scripts (a script runs in Redis without interleaving).
_SUBMIT: Final = """
if ARGV[1] == '1' then
  local existing = redis.call('GET', KEYS[1])
  if existing then return {0, existing} end
end
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ARGV[3])
if ARGV[1] == '1' then redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) end
redis.call('XADD', KEYS[3], '*', 'job', ARGV[2])
return {1, ARGV[2]}
"""
_START_ATTEMPT: Final = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return -1 end
if status == 'succeeded' or status == 'failed' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'attempts', 1)
"""
_COMPLETE: Final = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return -1 end
if status == 'succeeded' or status == 'failed' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[2], ARGV[3],
           'updated_at', ARGV[4], 'completed_at', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'completions', 1)
redis.call('HDEL', KEYS[1], 'request')
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""
# KEYS[1] the stream; ARGV: group, entry id, job id, consumer. Only an entry still pending to this consumer:
# one another gateway has taken over already is left to it (re-adding it would have two gateways work it).
_REQUEUE: Final = """
local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[4])
if #mine == 0 then return 0 end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[1], '*', 'job', ARGV[3])
return 1
"""


# KEYS[1] the job's hash; ARGV: the field, the review. Only a job still stored (an expired one stays gone).
_ADD_REVIEW: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class RedisJobStore(RedisStreamStore):
    """Durable jobs: hashes, a stream with one consumer group, Lua for the steps that must be atomic."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        claim_idle_s: float,
        ttl_s: int,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        # wait_replicas: replicas that must hold a submission before it is answered
        super().__init__(client, name="the job store", group=GROUP, wait_replicas=wait_replicas,
                         wait_timeout_ms=wait_timeout_ms)
        self.claim_idle_ms = max(1, int(claim_idle_s * 1000))
        self.ttl_s = ttl_s
        self._group_ready = False
        self._claim_cursor = "0-0"
        self._submit = self._script(_SUBMIT)
        self._start_attempt = self._script(_START_ATTEMPT)
        self._complete = self._script(_COMPLETE)
        self._requeue = self._script(_REQUEUE)
        self._add_review = self._script(_ADD_REVIEW)

    @staticmethod
    def job_key(job_id: str) -> str:
        """The job's hash."""
        return f"modgate:job:{job_id}"

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        await self._create_group(STREAM)
        self._group_ready = True

    async def submit(self, record: JobRecord, idempotency: str | None) -> tuple[JobRecord, bool]:
        """Store the job, its idempotency key and its stream entry at once, or find the existing job."""
        pairs = [item for pair in record.to_hash().items() for item in pair]
        idempotency_key = f"modgate:job-idempotency:{idempotency or 'none'}"
        async with self._unreachable("submit the job"):
            await self._ensure_group()
            created, job_id = await self._replicated(
                self._submit,
                [idempotency_key, self.job_key(record.id), STREAM],
                ["1" if idempotency else "0", record.id, self.ttl_s, *pairs],
                "the job",
            )
        if int(created) == 1:
            return record, True
        existing = await self.get(as_text(job_id))
        if existing is None:  # the job expired just now while its key lived on
            raise StateUnavailable("the job under this idempotency key has just expired; retry")
        return existing, False

    async def _replicated(self, script: AsyncScript, keys: list[str], args: list[Any], what: str) -> Any:
        """Run ``script``, then ``WAIT`` for ``wait_replicas`` replicas to hold its writes (on the same
        connection: WAIT counts that connection's writes). Redis replicates asynchronously, so a write the
        primary acknowledged is lost if the primary fails before a replica has it. Too few in time: 503,
        and the caller retries (a submission with its Idempotency-Key then finds the same job)."""
        answer, holding = await self._run_replicated(script, keys, args)
        if holding < self.wait_replicas:
            raise StateUnavailable(
                f"{what} is on the Redis primary but {holding} of {self.wait_replicas} replicas had it "
                f"within {self.wait_timeout_ms} ms; retry (with the same Idempotency-Key)"
            )
        return answer

    async def get(self, job_id: str) -> JobRecord | None:
        """A job, or None."""
        async with self._unreachable("read the job"):
            raw = await self._redis.hgetall(self.job_key(job_id))
        return JobRecord.from_hash(raw) if raw else None

    async def backlog(self) -> int:
        """Stream entries not yet acknowledged (queued or running)."""
        async with self._unreachable("count the jobs"):
            return int(await self._redis.xlen(STREAM))

    async def take(self, consumer: str, block_s: float) -> list[Delivery]:
        """A job a silent gateway left pending too long, else a new one (waiting up to ``block_s``)."""
        async with self._unreachable("take a job"):
            try:
                return await self._take(consumer, block_s)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._group_ready = False  # Redis lost the group (restarted without persistence)
                await self._ensure_group()
                return []

    async def _take(self, consumer: str, block_s: float) -> list[Delivery]:
        await self._ensure_group()
        # The cursor walks the whole pending list over successive calls (each call scans only a few
        # entries), so an idle entry behind many busy ones is still found.
        claimed = await self._redis.xautoclaim(
            STREAM, GROUP, consumer, self.claim_idle_ms, self._claim_cursor, count=1
        )
        self._claim_cursor = as_text(claimed[0]) if claimed else "0-0"
        entries = claimed[1] if len(claimed) > 1 else []
        if not entries:
            answer: Any = await self._redis.xreadgroup(
                GROUP, consumer, {STREAM: ">"}, count=1, block=int(block_s * 1000)
            )
            entries = [entry for _, stream_entries in answer or [] for entry in stream_entries]
        deliveries = []
        for entry_id, values in entries:
            job_id = (values or {}).get(b"job") or (values or {}).get("job")
            if job_id is None:  # an entry whose data is gone: nothing to work
                await self._redis.xack(STREAM, GROUP, entry_id)
                continue
            deliveries.append(Delivery(entry_id=as_text(entry_id), job_id=as_text(job_id)))
        return deliveries

    async def keep_fresh(self, consumer: str, delivery: Delivery) -> None:
        """Reset the entry's idle time (XCLAIM to ourselves), so no one takes over a job being worked."""
        async with self._unreachable("keep the job"):
            await self._redis.xclaim(STREAM, GROUP, consumer, 0, [delivery.entry_id], justid=True)

    async def start_attempt(self, job_id: str) -> int:
        """Mark running and count the attempt."""
        async with self._unreachable("start the job"):
            return int(await self._start_attempt(keys=[self.job_key(job_id)], args=[unix_now()]))

    async def complete(
        self, job_id: str, status: JobStatus, *, result: str | None, error: str | None
    ) -> bool:
        """Finish once: the script refuses a job already finished."""
        name, value = ("result", result) if status == "succeeded" else ("error", error)
        async with self._unreachable("complete the job"):
            done = await self._replicated(
                self._complete, [self.job_key(job_id)], [status, name, value or "", unix_now(), self.ttl_s],
                "the job's completion",
            )
        return int(done) == 1

    async def webhook_lease(self, job_id: str, consumer: str, lease_s: float) -> bool:
        """``SET NX`` a short lease: one gateway delivers at a time."""
        async with self._unreachable("lease the webhook"):
            leased = await self._redis.set(
                f"{self.job_key(job_id)}:webhook-lease", consumer, nx=True, px=max(1, int(lease_s * 1000))
            )
        return bool(leased)

    async def set_progress(self, job_id: str, frames_done: int, frames_total: int) -> None:
        """How far a running job is (two hash fields; nothing else reads them)."""
        async with self._unreachable("record the job's progress"):
            await self._redis.hset(
                self.job_key(job_id), mapping={"frames": frames_total, "frames_done": frames_done}
            )

    async def save_part(self, job_id: str, name: str, value: str) -> None:
        """A hash of its own beside the job's (``…:parts``), expiring with it: a read of the job never
        carries the pieces."""
        key = f"{self.job_key(job_id)}:parts"
        async with self._unreachable("keep a piece of the job's work"):
            await self._redis.hset(key, name, value)
            await self._redis.expire(key, self.ttl_s)

    async def parts(self, job_id: str) -> dict[str, str]:
        """The pieces kept so far."""
        async with self._unreachable("read the job's work so far"):
            raw = await self._redis.hgetall(f"{self.job_key(job_id)}:parts")
        return {as_text(name): as_text(value) for name, value in raw.items()}

    async def drop_parts(self, job_id: str) -> None:
        """Delete the pieces and the cut (left alone, they expire with the job's time to live); and the
        ``…:video`` key in which gateways before the spool kept a posted video's bytes."""
        key = self.job_key(job_id)
        async with self._unreachable("drop the job's work"):
            await self._redis.delete(f"{key}:parts", f"{key}:cut", f"{key}:video")

    async def save_cut(self, job_id: str, cut: bytes) -> None:
        """The cut's bytes as they are (no base64), in a key of their own beside the job's hash: a read of
        the job never carries them."""
        async with self._unreachable("keep the video's cut"):
            await self._redis.set(f"{self.job_key(job_id)}:cut", cut, ex=self.ttl_s)

    async def cut(self, job_id: str) -> bytes | None:
        """The cut's bytes, or None."""
        return await self._bytes(f"{self.job_key(job_id)}:cut", "read the video's cut")

    async def video_kept_before_spool(self, job_id: str) -> bytes | None:
        """The ``…:video`` key's bytes, or None."""
        return await self._bytes(f"{self.job_key(job_id)}:video", "read the video an older gateway kept")

    async def _bytes(self, key: str, doing: str) -> bytes | None:
        """A key's value as bytes (None: no such key)."""
        async with self._unreachable(doing):
            data = await self._redis.get(key)
        return data.encode() if isinstance(data, str) else data

    async def record_webhook(self, job_id: str, status: WebhookStatus, attempts: int) -> None:
        """Keep the delivery outcome with the job."""
        async with self._unreachable("record the webhook"):
            await self._redis.hset(
                self.job_key(job_id), mapping={"webhook_status": status, "webhook_attempts": attempts}
            )

    async def add_review(self, job_id: str, request_id: str, review: str) -> bool:
        """One hash field per label: no read-modify-write, so it never races the job's completion."""
        async with self._unreachable("keep the review with the job"):
            added = await self._add_review(
                keys=[self.job_key(job_id)], args=[f"{REVIEW_FIELD}{request_id}", review]
            )
        return int(added) == 1

    async def requeue(self, consumer: str, delivery: Delivery) -> bool:
        """Move the entry to the stream's end as a new one, so the next ``XREADGROUP`` of any gateway takes
        it now rather than after ``claim_idle_s`` (only while it is still pending to ``consumer``)."""
        async with self._unreachable("requeue the job"):
            moved = await self._requeue(
                keys=[STREAM], args=[GROUP, delivery.entry_id, delivery.job_id, consumer]
            )
        return int(moved) == 1

    async def ack(self, delivery: Delivery) -> None:
        """Acknowledge and delete the entry (the stream holds only unfinished work)."""
        async with self._unreachable("acknowledge the job"), self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(STREAM, GROUP, delivery.entry_id)
            pipe.xdel(STREAM, delivery.entry_id)
            await pipe.execute()
