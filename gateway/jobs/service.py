"""The service the routes use: submission checks, idempotency and reads; it owns the worker."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import socket
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from gateway.caller import Caller
from gateway.errors import Conflict, InvalidRequest, NotFound, Overloaded, StateUnavailable
from gateway.jobs.models import (
    FINISHED,
    Job,
    JobRecord,
    JobRequest,
    JobReview,
    VideoSource,
    new_job_id,
    unix_now,
)
from gateway.jobs.spool import SpooledVideo
from gateway.jobs.store import JobStore
from gateway.jobs.video import STORED_VIDEO, VideoJobs
from gateway.jobs.webhooks import WebhookFailed, WebhookSender
from gateway.jobs.worker import JobWorker
from gateway.moderation.frame_input import image_rejection
from gateway.moderation.keyframe_batch import Keyframe, check_video_id
from gateway.moderation.remote_images import RemoteImageFetcher, host_allowed, is_remote_url
from gateway.moderation.service import ModerationService
from gateway.settings import JobSettings
from gateway.tasks import stop
from shaping.errors import ImageRejected
from shaping.image import decode_data_url

log = logging.getLogger("modgate.jobs")

IDEMPOTENCY_KEY_PATTERN: Final = r"^[\x21-\x7e]{1,255}$"  # printable ASCII, no spaces (the document says)
_IDEMPOTENCY_KEY: Final = re.compile(IDEMPOTENCY_KEY_PATTERN)
SPOOL_SWEEP_EVERY_S: Final = 300.0  # how often a replica deletes spooled videos no job waits for


@dataclass
class JobService:
    """Submission checks, idempotency and reads; owns the worker."""

    store: JobStore
    settings: JobSettings
    moderation: ModerationService
    executor: Executor
    remote_images: RemoteImageFetcher | None = None
    webhooks: WebhookSender | None = None
    videos: VideoJobs | None = None  # None: video jobs are refused
    consumer: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    accepting: Callable[[], bool] = lambda: True  # False while the gateway drains (gateway/drain.py)
    worker: JobWorker = field(init=False)
    _review_posts: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _sweeper: asyncio.Task[None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.worker = JobWorker(
            self.store, self.moderation, self.settings, self.webhooks, self.consumer, self.accepting,
            self.videos,
        )
        if not self.store.durable:
            log.warning(
                "MODGATE_REDIS__URL is unset: jobs are kept in memory and are NOT durable: "
                "a restart loses every queued and running job"
            )

    async def submit(
        self, request: JobRequest, caller: Caller, idempotency_key: str | None, *,
        upload: SpooledVideo | None = None,
    ) -> tuple[Job, bool]:
        """Check and store a job; answers it and whether it is new (False: an idempotent replay).

        ``upload``: a multipart job's video, spooled under its job id (its request's video URL then names
        the stored video). A posted video's file is the job's once it is stored, and deleted otherwise."""
        job_id = upload.job_id if upload is not None else new_job_id()
        spooled, created, maybe_stored = upload, False, False
        try:
            check_video_id(request.video_id)
            frames = request.frames or []
            if len(frames) > self.settings.max_frames:
                raise InvalidRequest(
                    f"at most {self.settings.max_frames} frames per job, got {len(frames)}",
                    param="frames",
                )
            if request.webhook_url is not None:
                self._check_webhook_url(request.webhook_url)
            if request.video is not None:
                videos = await self.video_door()
                spooled = await videos.check(request, job_id, upload)
            await self._check_frames(frames)
            idempotency = self._idempotency(caller, idempotency_key)
            body = request.model_dump_json()
            # A posted video waits in the spool: its stored request names it only (a read of the job never
            # carries the video), and the job keeps the file's reference.
            stored_body = body if spooled is None else request.model_copy(
                update={"video": VideoSource(url=STORED_VIDEO)}).model_dump_json()
            if await self.store.backlog() >= self.settings.max_backlog:
                raise Overloaded(
                    f"{self.settings.max_backlog} jobs are already waiting",
                    retry_after=30,
                    code="job_backlog_full",
                )
            now = unix_now()
            sent = body.encode() if upload is None else body.encode() + bytes.fromhex(upload.sha256)
            record = JobRecord(
                id=job_id,
                tenant=caller.tenant,
                fingerprint=hashlib.sha256(sent).hexdigest(),
                video_id=request.video_id,
                frames=len(frames),  # a video's: 0 until it is cut
                request=stored_body,
                created_at=now,
                updated_at=now,
                webhook_url=request.webhook_url,
                webhook_status="pending" if request.webhook_url else None,
                video_file=None if spooled is None else spooled.dumps(),
            )
            try:
                stored, created = await self.store.submit(record, idempotency)
            except StateUnavailable:  # the job may be on the Redis primary all the same (too few replicas
                maybe_stored = True  # had it in time): its file stays, for the sweep to judge
                raise
        finally:  # a video refused (spooled or not yet), or a replay: the stored job has its own file
            if request.video is not None and not created and not maybe_stored and self.videos is not None:
                await self.videos.spool.discard(job_id)
        if not created and (stored.tenant != caller.tenant or stored.fingerprint != record.fingerprint):
            raise Conflict(
                "this Idempotency-Key was used for a different request",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        return stored.view(self.store.durable), created

    async def video_door(self) -> VideoJobs:
        """Whether a video may come in now: this gateway cuts videos and its cut queue has room (checked
        before a multipart upload is read, and again at its submission)."""
        if self.videos is None:
            raise InvalidRequest("this gateway takes no video jobs", param="video", code="video_unsupported")
        await self._check_cut_queue(self.videos)
        return self.videos

    @staticmethod
    def _idempotency(caller: Caller, idempotency_key: str | None) -> str | None:
        """The stored form of the tenant's ``Idempotency-Key`` (checked), or None."""
        if idempotency_key is None:
            return None
        if not _IDEMPOTENCY_KEY.fullmatch(idempotency_key):
            raise InvalidRequest(
                "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces",
                param="Idempotency-Key",
            )
        return hashlib.sha256(f"{caller.tenant}\0{idempotency_key}".encode()).hexdigest()

    async def get(self, job_id: str, caller: Caller) -> Job:
        """A job of the caller's tenant (another tenant's job reads as not found)."""
        record = await self.store.get(job_id) if re.fullmatch(r"job_[0-9a-f]{32}", job_id) else None
        if record is None or record.tenant != caller.tenant:
            raise NotFound(f"no job {job_id[:64]!r}", param="job_id")
        return record.view(self.store.durable)

    async def _check_cut_queue(self, videos: VideoJobs) -> None:
        """A video is taken only while the jobs before it are few enough: each may wait for a cut thread
        (the worker's jobs wait their turn there, never failed for it) and a posted video waits in the store
        meanwhile, so a full queue answers 429 at once rather than accept cut work it cannot start soon."""
        limit = videos.max_queued
        if await self.store.backlog() >= limit:
            raise Overloaded(
                f"{limit} jobs are already waiting for the video cut: try again later",
                retry_after=30,
                code="video_cut_busy",
            )

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

    async def _check_frames(self, frames: list[Keyframe]) -> None:
        """The cheap checks now (a clear 4xx at once); decoding waits for the worker."""
        max_bytes = self.moderation.settings.shaping.max_image_bytes
        for index, frame in enumerate(frames):
            url = frame.image_url.url  # a keyframe's image, as in POST /v1/videos/{video_id}/keyframes
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
        """Start the background worker, and the spool's sweep."""
        self.worker.start()
        if self.videos is not None:
            self._sweeper = asyncio.create_task(self._sweep_spool(self.videos), name="video-spool-sweep")

    async def _sweep_spool(self, videos: VideoJobs) -> None:
        """Now and then, delete the spooled videos no job waits for (every replica sweeps: a shared spool
        is swept by whichever comes first)."""
        while True:
            try:
                swept = await videos.spool.sweep(self._waits_for_video)
            except OSError as exc:
                log.warning("the video spool could not be swept: %s", exc)
            else:
                if swept:
                    log.info("the video spool sweep deleted %d files no job waits for", swept)
            await asyncio.sleep(SPOOL_SWEEP_EVERY_S)

    async def _waits_for_video(self, job_id: str) -> bool:
        """Whether the job may still need its spooled video (when the store cannot say: yes)."""
        try:
            record = await self.store.get(job_id)
        except StateUnavailable:
            return True
        return record is not None and record.status not in FINISHED

    async def add_review(self, job_id: str, review: JobReview) -> bool:
        """Keep a person's label with the job and post the job again to its webhook (``job.reviewed``,
        signed, retried with back-off, in the background); False when the job is gone."""
        if not await self.store.add_review(job_id, review.request_id, review.model_dump_json()):
            return False
        record = await self.store.get(job_id)
        if record is not None and record.webhook_url is not None and self.webhooks is not None:
            body = record.view(self.store.durable).model_dump_json().encode()
            task = asyncio.create_task(self._post_review(record.webhook_url, body, job_id, review.request_id))
            self._review_posts.add(task)
            task.add_done_callback(self._review_posts.discard)
        return True

    async def _post_review(self, url: str, body: bytes, job_id: str, request_id: str) -> None:
        assert self.webhooks is not None
        try:
            await self.webhooks.deliver(url, body, delivery_id=f"{job_id}:{request_id}", event="job.reviewed")
        except WebhookFailed as exc:
            log.warning("job %s: review webhook failed after %d attempts: %s", job_id, exc.attempts, exc)

    async def stop(self) -> None:
        """Stop the worker (running jobs get ``stop_grace_s`` to finish); close the webhook client."""
        await self.worker.stop(self.settings.stop_grace_s)
        # review webhooks still retrying are not kept across a restart
        await stop(self._sweeper, *self._review_posts)
        if self.webhooks is not None:
            await self.webhooks.aclose()


async def _off_loop(executor: Executor, function: Callable[..., Any], *args: Any) -> Any:
    result: Awaitable[Any] = asyncio.get_running_loop().run_in_executor(executor, function, *args)
    return await result
