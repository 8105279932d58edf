"""The worker: loops that take a job, moderate its frames, complete it once and post its webhook."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import stamina
from pydantic import BaseModel

from gateway.caller import Caller, JobKind
from gateway.errors import (
    ClientError,
    InvalidRequest,
    ModgateError,
    Overloaded,
    ServerSideError,
    StateUnavailable,
)
from gateway.jobs.models import Delivery, JobError, JobRecord, JobRequest, JobStatus
from gateway.jobs.spool import SpooledVideo
from gateway.jobs.store import JobStore
from gateway.jobs.video import Answered, VideoJobs
from gateway.jobs.webhooks import WebhookFailed, WebhookSender
from gateway.moderation.keyframe_batch import moderate_keyframes
from gateway.moderation.service import ModerationService
from gateway.settings import JobSettings
from gateway.tasks import stop

log = logging.getLogger("modgate.jobs")


class JobWorker:
    """``concurrency`` loops per gateway: take a job, moderate its frames, complete it, post its webhook."""

    def __init__(
        self,
        store: JobStore,
        moderation: ModerationService,
        settings: JobSettings,
        webhooks: WebhookSender | None,
        consumer: str,
        accepting: Callable[[], bool] = lambda: True,
        videos: VideoJobs | None = None,
    ) -> None:
        self.store = store
        self.videos = videos
        self.accepting = accepting  # False while the gateway drains: no new job is taken
        self.moderation = moderation
        self.settings = settings
        self.webhooks = webhooks
        self.consumer = consumer
        self._tasks: list[asyncio.Task[None]] = []
        self._working: dict[asyncio.Task[Any] | None, Delivery] = {}  # loop -> the job it works now
        self.requeued = 0  # jobs given back to the stream at stop
        # The flag as well as the cancel: Python 3.11's asyncio.timeout (inside redis-py) can turn a cancel
        # that lands as its deadline passes into a TimeoutError, which the loop would take for Redis down.
        self._stopping = False

    def start(self) -> None:
        """Start the loops (on the running event loop)."""
        for index in range(self.settings.concurrency):
            self._tasks.append(asyncio.create_task(self._loop(), name=f"job-worker-{index}"))

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop the loops: idle ones at once, busy ones after up to ``grace_s`` seconds to finish their job.

        A job still running then is cut off and put back on the stream (:meth:`JobStore.requeue`), so another
        gateway takes it now; if that fails too (Redis down) it stays pending and is taken over after
        ``claim_idle_s``. Either way it is not lost, and it completes once (the store refuses a second).
        """
        self._stopping = True
        for task in self._tasks:
            if task not in self._working:
                task.cancel()
        busy = [task for task in self._tasks if task in self._working]
        if busy and grace_s > 0:
            await asyncio.wait(busy, timeout=grace_s)
        cut = [delivery for task, delivery in self._working.items() if task is not None and not task.done()]
        await stop(*self._tasks)
        self._tasks.clear()
        for delivery in cut:
            try:
                moved = await self.store.requeue(self.consumer, delivery)
            except StateUnavailable as exc:
                log.warning("job %s: cut off at stop and not requeued (%s); it is taken over after %g s",
                            delivery.job_id, exc.message, self.settings.claim_idle_s)
                continue
            self.requeued += moved
            log.warning("job %s: cut off at stop; %s", delivery.job_id,
                        "back on the stream for another gateway" if moved else "another gateway has it")

    async def _loop(self) -> None:
        failures = 0
        while not self._stopping:
            if not self.accepting():  # draining: finish nothing new, take nothing new
                await asyncio.sleep(0.2)
                continue
            try:
                for delivery in await self.store.take(self.consumer, block_s=1.0):
                    await self.work(delivery)
                failures = 0
            except StateUnavailable as exc:
                if self._stopping:
                    return
                failures += 1
                wait = min(10.0, 0.2 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)
                log.warning("job worker: %s; retrying in %.1f s", exc.message, wait)
                await asyncio.sleep(wait)
            except Exception:
                if self._stopping:
                    return
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
            await stop(task)

    async def work(self, delivery: Delivery) -> None:
        """Work one job to its end (or leave it pending for a takeover if the job store goes away)."""
        me = asyncio.current_task()
        self._working[me] = delivery
        try:
            await self._work(delivery)
        finally:
            self._working.pop(me, None)

    async def _work(self, delivery: Delivery) -> None:
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
            request = None if record.request is None else JobRequest.model_validate_json(record.request)
            # (a record whose request is gone says nothing of its kind: it is counted as keyframes)
            kind: JobKind = "video" if request is not None and request.video is not None else "keyframes"
            if attempt > self.settings.max_attempts or request is None:
                await self._fail(
                    job_id,
                    ServerSideError(
                        f"the job did not finish within {self.settings.max_attempts} attempts",
                        code="job_attempts_exhausted",
                    ),
                    kind,
                )
                return record
            caller = Caller(tenant=record.tenant, key_id="job", job_id=job_id, job_kind=kind)
            # Behind live calls: the setting's priority, or the body's if it asks for even later.
            priority = max(request.priority, self.settings.priority)
            try:
                response: BaseModel
                if request.video is not None:
                    if self.videos is None:
                        raise InvalidRequest("this gateway takes no video jobs", param="video")
                    response = await self.videos.moderate(
                        self.moderation, request, caller, priority,
                        lambda done, total: self._progress(job_id, done, total),
                        Answered(load=lambda: self.store.parts(job_id),
                                 save=lambda name, value: self.store.save_part(job_id, name, value),
                                 cut=lambda: self.store.cut(job_id),
                                 save_cut=lambda cut: self.store.save_cut(job_id, cut),
                                 video=None if record.video_file is None
                                 else SpooledVideo.loads(record.video_file),
                                 kept_before_spool=lambda: self.store.video_kept_before_spool(job_id)),
                    )
                else:
                    response = await moderate_keyframes(
                        self.moderation, request.video_id, request, caller, None, priority=priority
                    )
            except (ServerSideError, Overloaded) as exc:
                if attempt >= self.settings.max_attempts:
                    await self._fail(job_id, exc, kind)
                    return record
                wait = min(60.0, self.settings.retry_wait_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                log.warning(
                    "job %s attempt %d failed (%s); retrying in %.1f s", job_id, attempt, exc.code, wait
                )
                await asyncio.sleep(wait)
                continue
            except ClientError as exc:
                await self._fail(job_id, exc, kind)
                return record
            except Exception:
                log.exception("job %s failed on a gateway bug", job_id)
                await self._fail(job_id, ServerSideError("internal error"), kind)
                return record
            done = await self._complete(job_id, "succeeded", result=response.model_dump_json())
            await self._finished(job_id, kind, "succeeded" if done else None, "ok")
            log.info("job %s %s", job_id, "succeeded" if done else "was already finished elsewhere")
            return record

    async def _progress(self, job_id: str, done: int, total: int) -> None:
        with contextlib.suppress(StateUnavailable):  # progress is a courtesy: never fail a job for it
            await self.store.set_progress(job_id, done, total)

    async def _fail(self, job_id: str, exc: ModgateError, kind: JobKind) -> None:
        error = JobError(message=exc.message, type=exc.type, code=exc.code).model_dump_json()
        done = await self._complete(job_id, "failed", error=error)
        await self._finished(job_id, kind, "failed" if done else None, exc.code)

    async def _finished(self, job_id: str, kind: JobKind, status: JobStatus | None, code: str) -> None:
        """A job has finished (``status`` None: elsewhere): recorded once; a video's kept cut and chunks
        dropped, its spooled file (still there when it failed before its cut) deleted."""
        if status is not None:
            self.moderation.recorder.job_finished(kind, status, code)
        if kind != "video":
            return
        with contextlib.suppress(StateUnavailable):  # left alone, they expire with the job
            await self.store.drop_parts(job_id)
        if self.videos is not None:
            try:
                await self.videos.spool.discard(job_id)
            except OSError as exc:  # the sweep deletes it later
                log.warning("job %s: its spooled video could not be deleted: %s", job_id, exc)

    async def _complete(
        self, job_id: str, status: JobStatus, *, result: str | None = None, error: str | None = None
    ) -> bool:
        # The engine's work is done: retry a short Redis outage rather than redo it after a takeover.
        async for attempt in stamina.retry_context(
            on=StateUnavailable, attempts=10, wait_initial=0.2, wait_max=2.0, timeout=None
        ):
            with attempt:
                return await self.store.complete(job_id, status, result=result, error=error)
        raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover - for mypy

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
