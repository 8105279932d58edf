"""The contract every job store keeps: where jobs live and how workers take them."""

from __future__ import annotations

from typing import Protocol

from gateway.jobs.models import Delivery, JobRecord, JobStatus, WebhookStatus


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

    async def set_progress(self, job_id: str, frames_done: int, frames_total: int) -> None:
        """How far a running job is: frames judged of the frames it has (a video's once it is cut)."""
        ...

    async def save_part(self, job_id: str, name: str, value: str) -> None:
        """Keep a piece of a running job's work (a video's judged chunk) for a retried attempt."""
        ...

    async def parts(self, job_id: str) -> dict[str, str]:
        """The pieces of the job's work kept so far (by name)."""
        ...

    async def drop_parts(self, job_id: str) -> None:
        """The job has finished: its pieces of work (and its video's cut) are no longer needed."""
        ...

    async def save_cut(self, job_id: str, cut: bytes) -> None:
        """Keep a video job's cut (its judged frames, shaped, and its coverage) beside the job, until it
        finishes: a retried attempt, here or on another gateway, judges these and never cuts again."""
        ...

    async def cut(self, job_id: str) -> bytes | None:
        """A video job's kept cut (None: not cut yet, or gone)."""
        ...

    async def video_kept_before_spool(self, job_id: str) -> bytes | None:
        """A posted video's bytes as a gateway from before the spool kept them beside its job (None: none
        kept): a job such a gateway queued is still cut after an upgrade."""
        ...

    async def webhook_lease(self, job_id: str, consumer: str, lease_s: float) -> bool:
        """Whether this gateway may deliver the job's webhook now (no one else is)."""
        ...

    async def record_webhook(self, job_id: str, status: WebhookStatus, attempts: int) -> None:
        """How the webhook delivery went."""
        ...

    async def requeue(self, consumer: str, delivery: Delivery) -> bool:
        """Give a job this gateway was cut off from back to the others at once (it is stopping); False if
        the entry is no longer this gateway's (taken over already)."""
        ...

    async def add_review(self, job_id: str, request_id: str, review: str) -> bool:
        """Keep a person's label of one frame with the job (False: the job is gone)."""
        ...

    async def ack(self, delivery: Delivery) -> None:
        """The job needs no more work: drop its stream entry."""
        ...
