"""Jobs in one process's memory: the same API as Redis, NOT durable (a restart loses them)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Final

from gateway.jobs.models import FINISHED, Delivery, JobRecord, JobStatus, WebhookStatus, unix_now

_MEMORY_FINISHED_KEPT: Final = 10_000


class MemoryJobStore:
    """Jobs in this process only: NOT durable (a restart loses every queued and running job)."""

    durable = False

    def __init__(self) -> None:
        self._records: dict[str, JobRecord] = {}
        self._idempotency: dict[str, str] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._finished: OrderedDict[str, str | None] = OrderedDict()  # job id → its idempotency entry
        self._parts: dict[str, dict[str, str]] = {}  # a running job's pieces of work, until it finishes
        self._cuts: dict[str, bytes] = {}  # a video job's cut, until it finishes

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
        record.status, record.updated_at = "running", unix_now()
        record.attempts += 1
        return record.attempts

    async def complete(
        self, job_id: str, status: JobStatus, *, result: str | None, error: str | None
    ) -> bool:
        """Finish once."""
        record = self._records.get(job_id)
        if record is None or record.status in FINISHED:
            return False
        now = unix_now()
        record.status, record.result, record.error = status, result, error
        record.updated_at = record.completed_at = now
        record.completions += 1
        record.request = None
        self._parts.pop(job_id, None)
        self._cuts.pop(job_id, None)
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

    async def set_progress(self, job_id: str, frames_done: int, frames_total: int) -> None:
        """How far a running job is."""
        if (record := self._records.get(job_id)) is not None:
            record.frames, record.frames_done = frames_total, frames_done

    async def save_part(self, job_id: str, name: str, value: str) -> None:
        """Keep a piece of the job's work."""
        self._parts.setdefault(job_id, {})[name] = value

    async def parts(self, job_id: str) -> dict[str, str]:
        """The pieces kept so far."""
        return dict(self._parts.get(job_id, {}))

    async def drop_parts(self, job_id: str) -> None:
        """Forget the pieces and the cut (completing the job forgets them too)."""
        self._parts.pop(job_id, None)
        self._cuts.pop(job_id, None)

    async def save_cut(self, job_id: str, cut: bytes) -> None:
        """Keep the video's cut."""
        self._cuts[job_id] = cut

    async def cut(self, job_id: str) -> bytes | None:
        """The video's cut."""
        return self._cuts.get(job_id)

    async def video_kept_before_spool(self, job_id: str) -> bytes | None:
        """None: a job in memory never outlives the gateway that queued it."""
        return None

    async def record_webhook(self, job_id: str, status: WebhookStatus, attempts: int) -> None:
        """Keep the delivery outcome."""
        if (record := self._records.get(job_id)) is not None:
            record.webhook_status, record.webhook_attempts = status, attempts

    async def add_review(self, job_id: str, request_id: str, review: str) -> bool:
        """Keep the label with the job."""
        if (record := self._records.get(job_id)) is None:
            return False
        record.reviews[request_id] = review
        return True

    async def requeue(self, consumer: str, delivery: Delivery) -> bool:
        """Queue the job again (for this process's next loop: memory has no other gateway)."""
        if delivery.job_id not in self._records:
            return False
        self._queue.put_nowait(delivery.job_id)
        return True

    async def ack(self, delivery: Delivery) -> None:
        """Nothing to drop: the queue already handed the job out."""
