"""Keyframe batches as jobs: accepted at once (202 and an id), worked in the background, never lost.

With Redis (``MODGATE_REDIS_URL``) jobs are durable:

- a job is a hash ``modgate:job:<id>`` (status, request, result, webhook state). Submitting writes it, the
  tenant's idempotency key and an entry on the stream ``modgate:jobs`` in one Lua script: per idempotency
  key a job exists exactly once, or not at all;
- every gateway reads the stream as one consumer group, so each entry goes to one gateway and stays
  *pending* until that gateway acknowledges it. A pending entry idle longer than ``claim_idle_s`` (its
  gateway was killed) is taken over with XAUTOCLAIM by whichever gateway asks next, the restarted one or
  another replica. A gateway working a job keeps its entry fresh (XCLAIM to itself), so a long job is not
  taken from a live gateway;
- completing is one Lua script that stores the result only if the job is not finished yet: however many
  times a job is worked (a takeover racing a slow gateway), it completes once;
- the webhook goes out after completion, signed (``X-Modgate-Signature: t=<unix>,v1=<hex HMAC-SHA256 of
  "<t>." + body>``) and retried with back-off. Delivery is at least once: a gateway killed after the
  receiver answered but before the delivery was recorded sends it again, with the same
  ``X-Modgate-Delivery`` id (the job id) and the same body, so the receiver can drop the repeat.

Without Redis the same API and worker run on a dict and a queue, and jobs are NOT durable: a restart loses
every queued and running job. The gateway says so at start, and every job says ``"durable": false``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import random
import re
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal, Protocol

import httpx
import redis.asyncio as aioredis
import stamina
from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import RedisError, ResponseError

from gateway.errors import (
    ClientError,
    Conflict,
    InvalidRequest,
    ModgateError,
    NotFound,
    Overloaded,
    ServerSideError,
    StateUnavailable,
)
from gateway.http.auth import Caller
from gateway.moderation.remote_images import RemoteImageFetcher, host_allowed, is_remote_url
from gateway.moderation.service import ModerationService, image_rejection
from gateway.moderation.wire import (
    ImageURLPart,
    ModerationRequest,
    ModerationResponse,
    RequestOptions,
    TextPart,
)
from gateway.settings import JobSettings
from shaping.errors import ImageRejected
from shaping.image import decode_data_url

log = logging.getLogger("modgate.jobs")

JobStatus = Literal["queued", "running", "succeeded", "failed"]
WebhookStatus = Literal["pending", "delivered", "failed"]
FINISHED: Final = frozenset({"succeeded", "failed"})

STREAM: Final = "modgate:jobs"
GROUP: Final = "gateways"
SIGNATURE_HEADER: Final = "X-Modgate-Signature"
DELIVERY_HEADER: Final = "X-Modgate-Delivery"
_IDEMPOTENCY_KEY: Final = re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no spaces
_MEMORY_FINISHED_KEPT: Final = 10_000


# --- wire ----------------------------------------------------------------------------------------------


class JobRequest(BaseModel):
    """``POST /v1/jobs``: one video's keyframes, moderated in the background."""

    model_config = ConfigDict(extra="forbid")

    video_id: str = Field(min_length=1, max_length=200)
    frames: list[ImageURLPart] = Field(min_length=1)
    webhook_url: str | None = Field(default=None, min_length=1, max_length=2048)
    # honoured where the thinking policy lets callers choose
    thinking: Literal["on", "off", "escalate"] | None = None


class JobError(BaseModel):
    """Why a job failed, in the OpenAI error shape's fields."""

    message: str
    type: str
    code: str


class WebhookState(BaseModel):
    """Where a job's result is posted, and how that went."""

    url: str
    status: WebhookStatus
    attempts: int


class Job(BaseModel):
    """A job as its caller sees it; ``result`` once it has succeeded, ``error`` once it has failed."""

    id: str
    object: Literal["moderation.job"] = "moderation.job"
    status: JobStatus
    video_id: str
    frames: int
    durable: bool  # false: kept in this gateway's memory only, lost on restart
    created_at: int
    updated_at: int
    completed_at: int | None = None
    attempts: int = 0
    result: ModerationResponse | None = None
    error: JobError | None = None
    webhook: WebhookState | None = None


# --- records and stores --------------------------------------------------------------------------------


@dataclass
class JobRecord:
    """A job as stored: every field a string-able value (one Redis hash field each)."""

    id: str
    tenant: str
    fingerprint: str  # SHA-256 of the request: a replayed idempotency key must carry the same request
    video_id: str
    frames: int
    status: JobStatus = "queued"
    request: str | None = None  # the JobRequest JSON; dropped once the job has finished
    created_at: int = 0
    updated_at: int = 0
    completed_at: int | None = None
    attempts: int = 0
    completions: int = 0  # how many times the job was completed: 1 once finished, never more
    result: str | None = None
    error: str | None = None
    webhook_url: str | None = None
    webhook_status: WebhookStatus | None = None
    webhook_attempts: int = 0

    def to_hash(self) -> dict[str, str]:
        """The record as Redis hash fields (None fields left out)."""
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> JobRecord:
        """Read a Redis hash back."""
        values = {_text(k): _text(v) for k, v in raw.items()}
        numbers = {
            "frames",
            "created_at",
            "updated_at",
            "completed_at",
            "attempts",
            "completions",
            "webhook_attempts",
        }
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {
            name: int(value) if name in numbers else value for name, value in values.items() if name in known
        }
        return cls(**kwargs)

    def view(self, durable: bool) -> Job:
        """What the caller sees."""
        return Job(
            id=self.id,
            status=self.status,
            video_id=self.video_id,
            frames=self.frames,
            durable=durable,
            created_at=self.created_at,
            updated_at=self.updated_at,
            completed_at=self.completed_at,
            attempts=self.attempts,
            result=None if self.result is None else ModerationResponse.model_validate_json(self.result),
            error=None if self.error is None else JobError.model_validate_json(self.error),
            webhook=None
            if self.webhook_url is None
            else WebhookState(
                url=self.webhook_url, status=self.webhook_status or "pending", attempts=self.webhook_attempts
            ),
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """A stream entry handed to this gateway: the job to work."""

    entry_id: str
    job_id: str


class JobStore(Protocol):
    """Where jobs live and how workers take them."""

    durable: bool

    async def submit(self, record: JobRecord, idempotency: str | None) -> tuple[JobRecord, bool]:
        """Store a new job, or answer the one already stored under ``idempotency`` (created: False)."""
        ...

    async def get(self, job_id: str) -> JobRecord | None:
        """A job, or None."""
        ...

    async def backlog(self) -> int:
        """Jobs queued or running."""
        ...

    async def take(self, consumer: str, block_s: float) -> list[Delivery]:
        """The next job for this gateway: one taken over from a silent gateway first, else a new one."""
        ...

    async def keep_fresh(self, consumer: str, delivery: Delivery) -> None:
        """Tell the others this gateway is still working the job."""
        ...

    async def start_attempt(self, job_id: str) -> int:
        """Mark the job running; answers the attempt's number, 0 if already finished, -1 if gone."""
        ...

    async def complete(
        self, job_id: str, status: JobStatus, *, result: str | None, error: str | None
    ) -> bool:
        """Finish the job, unless it already is; True only for the call that finished it."""
        ...

    async def webhook_lease(self, job_id: str, consumer: str, lease_s: float) -> bool:
        """Whether this gateway may deliver the job's webhook now (no one else is)."""
        ...

    async def record_webhook(self, job_id: str, status: WebhookStatus, attempts: int) -> None:
        """How the webhook delivery went."""
        ...

    async def ack(self, delivery: Delivery) -> None:
        """The job needs no more work: drop its stream entry."""
        ...


def _now() -> int:
    return int(time.time())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class MemoryJobStore:
    """Jobs in this process only: NOT durable (a restart loses every queued and running job)."""

    durable = False

    def __init__(self) -> None:
        self._records: dict[str, JobRecord] = {}
        self._idempotency: dict[str, str] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._finished: OrderedDict[str, str | None] = OrderedDict()  # job id → its idempotency entry

    async def submit(self, record: JobRecord, idempotency: str | None) -> tuple[JobRecord, bool]:
        """Store a new job, or answer the one already under ``idempotency``."""
        if idempotency is not None and (existing := self._idempotency.get(idempotency)) in self._records:
            return self._records[existing], False
        self._records[record.id] = record
        if idempotency is not None:
            self._idempotency[idempotency] = record.id
        self._finished[record.id] = idempotency  # moved to the end again when it finishes
        self._queue.put_nowait(record.id)
        return record, True

    async def get(self, job_id: str) -> JobRecord | None:
        """A job, or None."""
        return self._records.get(job_id)

    async def backlog(self) -> int:
        """Jobs queued or running."""
        return sum(1 for r in self._records.values() if r.status not in FINISHED)

    async def take(self, consumer: str, block_s: float) -> list[Delivery]:
        """The next queued job, waiting up to ``block_s``."""
        try:
            job_id = await asyncio.wait_for(self._queue.get(), block_s)
        except TimeoutError:
            return []
        return [Delivery(entry_id=job_id, job_id=job_id)]

    async def keep_fresh(self, consumer: str, delivery: Delivery) -> None:
        """Nothing to tell: no other gateway sees these jobs."""

    async def start_attempt(self, job_id: str) -> int:
        """Mark running and count the attempt."""
        record = self._records.get(job_id)
        if record is None:
            return -1
        if record.status in FINISHED:
            return 0
        record.status, record.updated_at = "running", _now()
        record.attempts += 1
        return record.attempts

    async def complete(
        self, job_id: str, status: JobStatus, *, result: str | None, error: str | None
    ) -> bool:
        """Finish once."""
        record = self._records.get(job_id)
        if record is None or record.status in FINISHED:
            return False
        now = _now()
        record.status, record.result, record.error = status, result, error
        record.updated_at = record.completed_at = now
        record.completions += 1
        record.request = None
        self._finished.move_to_end(job_id)
        self._forget_oldest()
        return True

    def _forget_oldest(self) -> None:
        """Keep at most ``_MEMORY_FINISHED_KEPT`` finished jobs (memory stays bounded)."""
        finished = [job_id for job_id in self._finished if self._records[job_id].status in FINISHED]
        for job_id in finished[: max(0, len(finished) - _MEMORY_FINISHED_KEPT)]:
            idempotency = self._finished.pop(job_id)
            self._records.pop(job_id, None)
            if idempotency is not None:
                self._idempotency.pop(idempotency, None)

    async def webhook_lease(self, job_id: str, consumer: str, lease_s: float) -> bool:
        """Always: one worker pool, one delivery at a time per job."""
        return True

    async def record_webhook(self, job_id: str, status: WebhookStatus, attempts: int) -> None:
        """Keep the delivery outcome."""
        if (record := self._records.get(job_id)) is not None:
            record.webhook_status, record.webhook_attempts = status, attempts

    async def ack(self, delivery: Delivery) -> None:
        """Nothing to drop: the queue already handed the job out."""


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


class RedisJobStore:
    """Durable jobs: hashes, a stream with one consumer group, Lua for the steps that must be atomic."""

    durable = True

    def __init__(self, client: aioredis.Redis, *, claim_idle_s: float, ttl_s: int) -> None:
        self._redis = client
        self.claim_idle_ms = max(1, int(claim_idle_s * 1000))
        self.ttl_s = ttl_s
        self._group_ready = False
        self._claim_cursor = "0-0"
        self._submit = client.register_script(_SUBMIT)
        self._start_attempt = client.register_script(_START_ATTEMPT)
        self._complete = client.register_script(_COMPLETE)

    @staticmethod
    def job_key(job_id: str) -> str:
        """The job's hash."""
        return f"modgate:job:{job_id}"

    @asynccontextmanager
    async def _state(self, doing: str) -> AsyncIterator[None]:
        """Redis failures become a 503 the caller can retry (and the worker backs off on)."""
        try:
            yield
        except RedisError as exc:
            raise StateUnavailable(
                f"cannot {doing}: the job store (Redis) is unreachable ({type(exc).__name__})"
            ) from exc

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self._redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def submit(self, record: JobRecord, idempotency: str | None) -> tuple[JobRecord, bool]:
        """Store the job, its idempotency key and its stream entry at once, or find the existing job."""
        pairs = [item for pair in record.to_hash().items() for item in pair]
        idempotency_key = f"modgate:job-idempotency:{idempotency or 'none'}"
        async with self._state("submit the job"):
            await self._ensure_group()
            created, job_id = await self._submit(
                keys=[idempotency_key, self.job_key(record.id), STREAM],
                args=["1" if idempotency else "0", record.id, self.ttl_s, *pairs],
            )
        if int(created) == 1:
            return record, True
        existing = await self.get(_text(job_id))
        if existing is None:  # the job expired just now while its key lived on
            raise StateUnavailable("the job under this idempotency key has just expired; retry")
        return existing, False

    async def get(self, job_id: str) -> JobRecord | None:
        """A job, or None."""
        async with self._state("read the job"):
            raw = await self._redis.hgetall(self.job_key(job_id))
        return JobRecord.from_hash(raw) if raw else None

    async def backlog(self) -> int:
        """Stream entries not yet acknowledged (queued or running)."""
        async with self._state("count the jobs"):
            return int(await self._redis.xlen(STREAM))

    async def take(self, consumer: str, block_s: float) -> list[Delivery]:
        """A job a silent gateway left pending too long, else a new one (waiting up to ``block_s``)."""
        async with self._state("take a job"):
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
        self._claim_cursor = _text(claimed[0]) if claimed else "0-0"
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
            deliveries.append(Delivery(entry_id=_text(entry_id), job_id=_text(job_id)))
        return deliveries

    async def keep_fresh(self, consumer: str, delivery: Delivery) -> None:
        """Reset the entry's idle time (XCLAIM to ourselves), so no one takes over a job being worked."""
        async with self._state("keep the job"):
            await self._redis.xclaim(STREAM, GROUP, consumer, 0, [delivery.entry_id], justid=True)

    async def start_attempt(self, job_id: str) -> int:
        """Mark running and count the attempt."""
        async with self._state("start the job"):
            return int(await self._start_attempt(keys=[self.job_key(job_id)], args=[_now()]))

    async def complete(
        self, job_id: str, status: JobStatus, *, result: str | None, error: str | None
    ) -> bool:
        """Finish once: the script refuses a job already finished."""
        name, value = ("result", result) if status == "succeeded" else ("error", error)
        async with self._state("complete the job"):
            done = await self._complete(
                keys=[self.job_key(job_id)], args=[status, name, value or "", _now(), self.ttl_s]
            )
        return int(done) == 1

    async def webhook_lease(self, job_id: str, consumer: str, lease_s: float) -> bool:
        """``SET NX`` a short lease: one gateway delivers at a time."""
        async with self._state("lease the webhook"):
            leased = await self._redis.set(
                f"{self.job_key(job_id)}:webhook-lease", consumer, nx=True, px=max(1, int(lease_s * 1000))
            )
        return bool(leased)

    async def record_webhook(self, job_id: str, status: WebhookStatus, attempts: int) -> None:
        """Keep the delivery outcome with the job."""
        async with self._state("record the webhook"):
            await self._redis.hset(
                self.job_key(job_id), mapping={"webhook_status": status, "webhook_attempts": attempts}
            )

    async def ack(self, delivery: Delivery) -> None:
        """Acknowledge and delete the entry (the stream holds only unfinished work)."""
        async with self._state("acknowledge the job"), self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(STREAM, GROUP, delivery.entry_id)
            pipe.xdel(STREAM, delivery.entry_id)
            await pipe.execute()


# --- webhooks ------------------------------------------------------------------------------------------


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """``t=<unix>,v1=<hex HMAC-SHA256 of "<t>." + body>``: the value of ``X-Modgate-Signature``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify_webhook(
    secret: str, header: str, body: bytes, *, tolerance_s: int = 300, now: float | None = None
) -> bool:
    """What a receiver does: the signature matches the body, and its timestamp is recent (no replays)."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    timestamp, given = parts.get("t", ""), parts.get("v1", "")
    if not timestamp.isdigit() or not given:
        return False
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance_s:
        return False
    expected = sign_webhook(secret, int(timestamp), body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given)


class _RetryableStatus(Exception):
    """A webhook answer worth retrying (408, 429, 5xx)."""


class WebhookFailed(Exception):
    """The receiver did not take the webhook after every attempt."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class WebhookSender:
    """Posts signed job results, retrying transport errors and 408/429/5xx with jittered back-off."""

    def __init__(
        self,
        secret: str,
        *,
        timeout_s: float,
        attempts: int,
        wait_initial_s: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._secret = secret
        self.attempts = attempts
        self.wait_initial_s = wait_initial_s
        self._http = httpx.AsyncClient(
            timeout=timeout_s, transport=transport, trust_env=False, follow_redirects=False
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def deliver(self, url: str, body: bytes, delivery_id: str) -> int:
        """Post ``body`` to ``url``; answers the attempts it took, or raises :class:`WebhookFailed`."""
        tried = 0
        try:
            async for attempt in stamina.retry_context(
                on=(httpx.TransportError, _RetryableStatus),
                attempts=self.attempts,
                wait_initial=self.wait_initial_s,
                wait_max=30.0,
                wait_jitter=self.wait_initial_s,
                timeout=None,
            ):
                with attempt:
                    tried += 1
                    response = await self._http.post(
                        url,
                        content=body,
                        headers={
                            "Content-Type": "application/json",
                            "User-Agent": "modgate-webhook",
                            SIGNATURE_HEADER: sign_webhook(self._secret, _now(), body),
                            DELIVERY_HEADER: delivery_id,
                            "X-Modgate-Event": "job.finished",
                        },
                    )
                    if response.status_code in (408, 429) or response.status_code >= 500:
                        raise _RetryableStatus(f"the receiver answered {response.status_code}")
                    if response.status_code >= 300:
                        raise WebhookFailed(
                            f"the receiver refused the webhook ({response.status_code})", tried
                        )
        except (httpx.TransportError, _RetryableStatus) as exc:
            raise WebhookFailed(f"the webhook was not delivered: {exc!r}", tried) from exc
        return tried


# --- the worker ----------------------------------------------------------------------------------------


class JobWorker:
    """``concurrency`` loops per gateway: take a job, moderate its frames, complete it, post its webhook."""

    def __init__(
        self,
        store: JobStore,
        moderation: ModerationService,
        settings: JobSettings,
        webhooks: WebhookSender | None,
        consumer: str,
    ) -> None:
        self.store = store
        self.moderation = moderation
        self.settings = settings
        self.webhooks = webhooks
        self.consumer = consumer
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the loops (on the running event loop)."""
        for index in range(self.settings.concurrency):
            self._tasks.append(asyncio.create_task(self._loop(), name=f"job-worker-{index}"))

    async def stop(self) -> None:
        """Stop the loops; a job cut off here stays pending and is taken over later."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _loop(self) -> None:
        failures = 0
        while True:
            try:
                for delivery in await self.store.take(self.consumer, block_s=1.0):
                    await self.work(delivery)
                failures = 0
            except StateUnavailable as exc:
                failures += 1
                wait = min(10.0, 0.2 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)
                log.warning("job worker: %s; retrying in %.1f s", exc.message, wait)
                await asyncio.sleep(wait)
            except Exception:
                log.exception("job worker: unexpected error; carrying on")
                await asyncio.sleep(1.0)

    @asynccontextmanager
    async def _kept_fresh(self, delivery: Delivery) -> AsyncIterator[None]:
        async def refresh() -> None:
            while True:
                await asyncio.sleep(self.settings.claim_idle_s / 3)
                with contextlib.suppress(StateUnavailable):
                    await self.store.keep_fresh(self.consumer, delivery)

        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def work(self, delivery: Delivery) -> None:
        """Work one job to its end (or leave it pending for a takeover if the job store goes away)."""
        async with self._kept_fresh(delivery):
            finished = await self._run(delivery.job_id)
            if finished is None:
                await self.store.ack(delivery)
                return
            if not await self._post_webhook(delivery.job_id):
                return  # another gateway is delivering; it acknowledges the entry when done
        await self.store.ack(delivery)

    async def _run(self, job_id: str) -> JobRecord | None:
        """Attempts until the job finishes; None if the job no longer exists."""
        while True:
            attempt = await self.store.start_attempt(job_id)
            if attempt == -1:
                return None
            record = await self.store.get(job_id)
            if record is None:
                return None
            if attempt == 0:
                return record  # finished already (by us before a crash, or by another gateway)
            if attempt > self.settings.max_attempts or record.request is None:
                await self._fail(
                    job_id,
                    ServerSideError(
                        f"the job did not finish within {self.settings.max_attempts} attempts",
                        code="job_attempts_exhausted",
                    ),
                )
                return record
            try:
                response = await self.moderation.moderate(
                    self._moderation_request(record), Caller(tenant=record.tenant, key_id="job"), None
                )
            except (ServerSideError, Overloaded) as exc:
                if attempt >= self.settings.max_attempts:
                    await self._fail(job_id, exc)
                    return record
                wait = min(60.0, self.settings.retry_wait_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                log.warning(
                    "job %s attempt %d failed (%s); retrying in %.1f s", job_id, attempt, exc.code, wait
                )
                await asyncio.sleep(wait)
                continue
            except ClientError as exc:
                await self._fail(job_id, exc)
                return record
            except Exception:
                log.exception("job %s failed on a gateway bug", job_id)
                await self._fail(job_id, ServerSideError("internal error"))
                return record
            done = await self._complete(job_id, "succeeded", result=response.model_dump_json())
            log.info("job %s %s", job_id, "succeeded" if done else "was already finished elsewhere")
            return record

    def _moderation_request(self, record: JobRecord) -> ModerationRequest:
        request = JobRequest.model_validate_json(record.request or "{}")
        frames: list[ImageURLPart | TextPart] = [*request.frames]
        return ModerationRequest(
            input=frames,
            modgate=RequestOptions(
                thinking=request.thinking, video_id=request.video_id, priority=self.settings.priority
            ),
        )

    async def _fail(self, job_id: str, exc: ModgateError) -> None:
        error = JobError(message=exc.message, type=exc.type, code=exc.code).model_dump_json()
        await self._complete(job_id, "failed", error=error)

    async def _complete(
        self, job_id: str, status: JobStatus, *, result: str | None = None, error: str | None = None
    ) -> bool:
        # The engine's work is done: retry a short Redis outage rather than redo it after a takeover.
        async for attempt in stamina.retry_context(
            on=StateUnavailable, attempts=10, wait_initial=0.2, wait_max=2.0, timeout=None
        ):
            with attempt:
                return await self.store.complete(job_id, status, result=result, error=error)
        raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover

    async def _post_webhook(self, job_id: str) -> bool:
        """Deliver the finished job's webhook if it is due; False if another gateway holds the delivery."""
        record = await self.store.get(job_id)
        if record is None or record.webhook_url is None or record.webhook_status != "pending":
            return True
        if self.webhooks is None:
            log.warning("job %s has a webhook but MODGATE_JOBS__WEBHOOK_SECRET is unset: not sent", job_id)
            await self.store.record_webhook(job_id, "failed", 0)
            return True
        lease_s = self.settings.webhook_timeout_s * self.settings.webhook_attempts * 2 + 60
        if not await self.store.webhook_lease(job_id, self.consumer, lease_s):
            return False
        body = record.view(self.store.durable).model_dump_json().encode()
        try:
            attempts = await self.webhooks.deliver(record.webhook_url, body, delivery_id=job_id)
        except WebhookFailed as exc:
            log.warning("job %s: webhook failed after %d attempts: %s", job_id, exc.attempts, exc)
            await self.store.record_webhook(job_id, "failed", exc.attempts)
            return True
        await self.store.record_webhook(job_id, "delivered", attempts)
        return True


# --- the service the routes use ------------------------------------------------------------------------


@dataclass
class JobService:
    """Submission checks, idempotency and reads; owns the worker."""

    store: JobStore
    settings: JobSettings
    moderation: ModerationService
    executor: Executor
    remote_images: RemoteImageFetcher | None = None
    webhooks: WebhookSender | None = None
    consumer: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    worker: JobWorker = field(init=False)

    def __post_init__(self) -> None:
        self.worker = JobWorker(self.store, self.moderation, self.settings, self.webhooks, self.consumer)
        if not self.store.durable:
            log.warning(
                "MODGATE_REDIS_URL is unset: jobs are kept in memory and are NOT durable: "
                "a restart loses every queued and running job"
            )

    async def submit(
        self, request: JobRequest, caller: Caller, idempotency_key: str | None
    ) -> tuple[Job, bool]:
        """Check and store a job; answers it and whether it is new (False: an idempotent replay)."""
        if len(request.frames) > self.settings.max_frames:
            raise InvalidRequest(
                f"at most {self.settings.max_frames} frames per job, got {len(request.frames)}",
                param="frames",
            )
        if request.webhook_url is not None:
            self._check_webhook_url(request.webhook_url)
        await self._check_frames(request)
        idempotency = None
        if idempotency_key is not None:
            if not _IDEMPOTENCY_KEY.fullmatch(idempotency_key):
                raise InvalidRequest(
                    "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces",
                    param="Idempotency-Key",
                )
            idempotency = hashlib.sha256(f"{caller.tenant}\0{idempotency_key}".encode()).hexdigest()
        body = request.model_dump_json()
        if await self.store.backlog() >= self.settings.max_backlog:
            raise Overloaded(
                f"{self.settings.max_backlog} jobs are already waiting",
                retry_after=30,
                code="job_backlog_full",
            )
        now = _now()
        record = JobRecord(
            id=f"job_{uuid.uuid4().hex}",
            tenant=caller.tenant,
            fingerprint=hashlib.sha256(body.encode()).hexdigest(),
            video_id=request.video_id,
            frames=len(request.frames),
            request=body,
            created_at=now,
            updated_at=now,
            webhook_url=request.webhook_url,
            webhook_status="pending" if request.webhook_url else None,
        )
        stored, created = await self.store.submit(record, idempotency)
        if not created and (stored.tenant != caller.tenant or stored.fingerprint != record.fingerprint):
            raise Conflict(
                "this Idempotency-Key was used for a different request",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        return stored.view(self.store.durable), created

    async def get(self, job_id: str, caller: Caller) -> Job:
        """A job of the caller's tenant (another tenant's job reads as not found)."""
        record = await self.store.get(job_id) if re.fullmatch(r"job_[0-9a-f]{32}", job_id) else None
        if record is None or record.tenant != caller.tenant:
            raise NotFound(f"no job {job_id[:64]!r}", param="job_id")
        return record.view(self.store.durable)

    def _check_webhook_url(self, url: str) -> None:
        if self.webhooks is None:
            raise InvalidRequest(
                "webhooks are disabled: the operator has not set MODGATE_JOBS__WEBHOOK_SECRET",
                param="webhook_url",
                code="webhooks_disabled",
            )
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise InvalidRequest("webhook_url is not a valid URL", param="webhook_url") from exc
        host = parsed.raw_host.decode("ascii", "replace")
        if parsed.scheme not in ("http", "https") or parsed.userinfo or not host:
            raise InvalidRequest(
                "webhook_url must be an http(s) URL without credentials", param="webhook_url"
            )
        if not host_allowed(host, self.settings.webhook_allowlist):
            raise InvalidRequest(
                f"webhook host {host[:100]!r} is not on the webhook allowlist",
                param="webhook_url",
                code="webhook_refused",
            )

    async def _check_frames(self, request: JobRequest) -> None:
        """The cheap checks now (a clear 4xx at once); decoding waits for the worker."""
        max_bytes = self.moderation.settings.shaping.max_image_bytes
        for index, frame in enumerate(request.frames):
            url = frame.image_url.url
            if is_remote_url(url):
                if self.remote_images is None:
                    raise InvalidRequest(
                        "image URLs are not fetched by this gateway: send data: URLs",
                        param=f"frames[{index}]",
                        code="invalid_data_url",
                    )
                self.remote_images.check_url(url)
                continue
            try:
                await _off_loop(self.executor, decode_data_url, url, max_bytes)
            except ImageRejected as exc:
                error = image_rejection(exc)
                error.param = f"frames[{index}]"
                raise error from exc

    def start(self) -> None:
        """Start the background worker."""
        self.worker.start()

    async def stop(self) -> None:
        """Stop the worker; close the webhook client."""
        await self.worker.stop()
        if self.webhooks is not None:
            await self.webhooks.aclose()


async def _off_loop(executor: Executor, function: Callable[..., Any], *args: Any) -> Any:
    result: Awaitable[Any] = asyncio.get_running_loop().run_in_executor(executor, function, *args)
    return await result
