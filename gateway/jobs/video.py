"""Video jobs: a video in (a multipart file, a URL or a ``data:`` URL), covered on the clock and at shot
changes, its distinct frames judged as posted keyframes are, and merged into segments.

At submission the cheap checks answer a clear 4xx at once: the URL against the allowlist, a ``data:`` URL's
size and a container probe (a still image, no video stream, over the pixel limit, or over the duration
limit as its packets' timestamps measure it). A posted video waits as a file in the spool
(gateway/jobs/spool.py) and is probed from there. The probe runs on threads of its own within a timeout,
never behind a cut; when they are all busy and as many probes wait, the submission gets a 429. The worker
then fetches a URL into the spool (as image URLs are fetched: allowlist, public addresses only, the size
capped while streaming), cuts the video on threads of its own (``shaping/video``: every frame decoded and
checked, within a time budget; each judged frame shaped onto the token grid where it is decoded), keeps the
cut with the job and deletes the file: a retried attempt takes the cut from there, never cuts again. The
distinct frames go through the keyframe batch path (shaping, which passes them through as they are,
packing, reuse, thinking policy, tenants, decision log) in chunks, recording progress after each; a failed
chunk cancels the others. A video refused then fails the job with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.util
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec

from gateway.caller import Caller
from gateway.errors import (
    ClientError,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    ServerSideError,
    UnprocessableImage,
    UnsupportedMedia,
)
from gateway.jobs.models import JobRequest, VideoCoverage, VideoModerationResponse, VideoSegment
from gateway.jobs.spool import SpooledVideo, VideoSpool, VideoUnavailable
from gateway.moderation.frame_input import image_rejection
from gateway.moderation.keyframe_batch import (
    BatchOptions,
    EncodedKeyframe,
    KeyframeBatchResponse,
    KeyframeResult,
    moderate_encoded_keyframes,
    video_verdict,
)
from gateway.moderation.remote_images import (
    RemoteImageFetcher,
    RemoteImageRefused,
    RemoteImageTooLarge,
    RemoteImageUnavailable,
    is_remote_url,
)
from gateway.moderation.service import ModerationService
from gateway.moderation.verdict_cache import FrameIdentity, NearDuplicateRule
from gateway.settings import JobSettings, VideoSettings
from shaping.errors import ImageRejected
from shaping.image import shape_picture
from shaping.verdict import Action
from shaping.video import (
    CutFrame,
    Encode,
    FrameVerdict,
    Identity,
    Likeness,
    Sampling,
    VideoCut,
    VideoLimits,
    VideoRejected,
    VideoSource,
    cut_video,
    decode_video_data_url,
    merge_segments,
    probe_video,
)

T = TypeVar("T")
log = logging.getLogger("modgate.jobs")
STORED_VIDEO = "modgate:stored-video"  # a stored request's video URL: the video waits in the spool
Progress = Callable[[int, int], Awaitable[None]]
"""``(frames_done, frames_total)``: told after each chunk of frames is judged."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A job's work so far, kept with the job (gateway/jobs/store.py): its cut and the chunks judged, so a
    retried attempt cuts nothing again, asks the engine nothing twice, and logs no decision twice."""

    load: Callable[[], Awaitable[dict[str, str]]]
    save: Callable[[str, str], Awaitable[None]]
    cut: Callable[[], Awaitable[bytes | None]]  # the cut an earlier attempt kept
    save_cut: Callable[[bytes], Awaitable[None]]
    video: SpooledVideo | None = None  # a posted video's reference: the spooled file it waits in
    # a posted video's bytes as a gateway from before the spool kept them in the job store (None: none)
    kept_before_spool: Callable[[], Awaitable[bytes | None]] | None = None


def kept_cut(cut: VideoCut) -> bytes:
    """The cut as the job store keeps it: MessagePack, its frames' JPEG bytes as they are (no base64)."""
    return msgspec.msgpack.encode(cut)


def cut_from_kept(data: bytes) -> VideoCut:
    """A cut kept by an earlier attempt."""
    return msgspec.msgpack.decode(data, type=VideoCut)


def frame_decision_id(job_id: str, timestamp_ms: int, index: int) -> str:
    """A video job's frame's ``decision_id``: the same on every attempt (``dec-`` and 32 hex digits, as a
    fresh one has, from the job, the frame's time in the video and its place among the judged frames: a
    cut is the same on every attempt)."""
    return f"dec-{hashlib.sha256(f'{job_id}:{timestamp_ms}:{index}'.encode()).hexdigest()[:32]}"


def chunk_name(frames: list[CutFrame]) -> str:
    """A chunk's name among a job's parts: its frames' times (a retried cut is the same cut; were it not,
    a chunk of other frames is judged afresh)."""
    times = ",".join(str(frame.timestamp_ms) for frame in frames)
    return f"chunk:{hashlib.sha256(times.encode()).hexdigest()[:16]}"


def video_rejection(exc: VideoRejected) -> ClientError:
    """Translate a refused video into the gateway's client error of the same status."""
    kind: type[ClientError] = {413: PayloadTooLarge, 415: UnsupportedMedia, 422: UnprocessableImage}.get(
        exc.status, InvalidRequest
    )
    return kind(exc.message, code=exc.code, param="video")


def video_fetch_error(exc: ClientError) -> ClientError:
    """A video URL's fetch error under a code that speaks of videos (the fetcher is the image fetcher's)."""
    codes = {RemoteImageRefused: "video_url_refused", RemoteImageTooLarge: "video_too_large",
             RemoteImageUnavailable: "video_fetch_failed"}
    code = next((code for kind, code in codes.items() if isinstance(exc, kind)), exc.code)
    kind: type[ClientError] = type(exc)
    return kind(exc.message, code=code, param=exc.param)


def likeness(rule: NearDuplicateRule) -> Likeness:
    """Two frames of a video look the same when the gateway's near-duplicate rule says so (exact pixels
    only when near-duplicate reuse is off)."""

    def same(one: Identity, other: Identity) -> bool:
        if not rule.enabled:
            return one == other
        return rule.matches(FrameIdentity("", *one), FrameIdentity("", *other)) is not None

    return same


def video_support() -> bool:
    """Whether PyAV (the ``modgate[video]`` extra) is installed."""
    return importlib.util.find_spec("av") is not None


@dataclass
class VideoJobs:
    """Checks a video at submission; in the worker, loads it, cuts it and judges its frames."""

    settings: VideoSettings
    jobs: JobSettings
    executor: Executor  # the cut's own threads: a long cut never holds up a live keyframe's shaping
    fetcher: RemoteImageFetcher | None = None  # None: video URLs are refused (remote images are off)
    probes: Executor | None = None  # the submission's probe: threads of their own, never behind a cut
    rule: NearDuplicateRule = field(default_factory=NearDuplicateRule)
    max_queued: int = field(init=False)  # jobs queued or running before a video submission gets 429
    spool: VideoSpool = field(init=False)  # where videos wait as files until they are cut
    _probing: int = 0

    def __post_init__(self) -> None:
        self.spool = VideoSpool(self.settings.spool_dir, self.settings.max_bytes)
        self.max_queued = self.settings.max_queued_jobs

    @property
    def limits(self) -> VideoLimits:
        """The limits of a video, from the settings."""
        s = self.settings
        return VideoLimits(max_bytes=s.max_bytes, max_duration_s=s.max_duration_s, max_pixels=s.max_pixels,
                           max_decoded_frames=int(s.max_duration_s * s.max_decoded_fps))

    def sampling(self, request: JobRequest) -> Sampling:
        """The request's sampling, each unset field its setting (a gap no shorter than the setting's)."""
        asked, s = request.sampling, self.settings
        return Sampling(
            max_gap_s=max(s.max_gap_s, asked.max_gap_s) if asked and asked.max_gap_s else s.max_gap_s,
            max_fps=asked.max_fps if asked and asked.max_fps is not None else s.max_fps,
            scene_threshold=asked.scene_threshold if asked and asked.scene_threshold is not None
            else s.scene_threshold,
            max_frames=min(self.jobs.max_frames, asked.max_frames if asked and asked.max_frames else 1 << 30),
            allow_sparser=bool(asked and asked.allow_sparser),
        )

    async def check(
        self, request: JobRequest, job_id: str, upload: SpooledVideo | None = None
    ) -> SpooledVideo | None:
        """At submission: what can be told without decoding a frame (a clear 4xx at once). A posted video
        (``upload``: a multipart file already spooled; else a ``data:`` URL's bytes, spooled here) is probed
        from its file, whose reference is answered; None for a URL the worker fetches. A video refused
        leaves its file for the caller to discard."""
        assert request.video is not None
        if not video_support():
            raise InvalidRequest(
                "video jobs need PyAV on the gateway (pip install 'modgate[video]')",
                param="video", code="video_unsupported",
            )
        url = request.video.url
        if is_remote_url(url):
            if self.fetcher is None:
                raise InvalidRequest(
                    "video URLs are not fetched by this gateway (MODGATE_REMOTE_IMAGES__ENABLED is off): "
                    "send a data: URL or a multipart file",
                    param="video.url", code="invalid_data_url",
                )
            try:
                self.fetcher.check_url(url)
            except ClientError as exc:
                raise video_fetch_error(exc) from exc
            return None
        if self.sampling(request).max_frames < 1:
            raise InvalidRequest("max_frames must be at least 1", param="sampling.max_frames")
        if self._probing >= 2 * self.settings.probe_workers:
            raise Overloaded("every video probe is busy: try again shortly", retry_after=1,
                             code="video_probe_busy")
        self._probing += 1
        probes = self.probes or self.executor
        try:
            async with asyncio.timeout(self.settings.probe_timeout_s):
                if upload is None:
                    data = await self._rejecting(probes, decode_video_data_url, url, self.settings.max_bytes)
                    upload = await self.spool.keep(job_id, data)
                await self._rejecting(probes, probe_video, self.spool.path(job_id), self.limits)
                return upload
        except TimeoutError as exc:
            raise UnprocessableImage(
                f"the video was not probed within {self.settings.probe_timeout_s:g} s",
                code="video_probe_timeout", param="video",
            ) from exc
        finally:
            self._probing -= 1

    async def source(self, request: JobRequest, job_id: str, answered: Answered | None) -> VideoSource:
        """The video to cut: its spooled file (a posted one, checked to be the file received), a URL's
        video fetched into the spool, or a ``data:`` URL's bytes (a request stored before the spool)."""
        assert request.video is not None
        url = request.video.url
        if url == STORED_VIDEO:
            if answered is not None and answered.video is not None:
                return await self.spool.reachable(answered.video)
            # queued by a gateway from before the spool, which kept the bytes in the job store: spooled now
            kept = None
            if answered is not None and answered.kept_before_spool is not None:
                kept = await answered.kept_before_spool()
            if kept is None:
                raise VideoUnavailable("the job's video is neither spooled nor kept: submit it again",
                                       param="video")
            await self.spool.keep(job_id, kept)
            return self.spool.path(job_id)
        if is_remote_url(url):
            if self.fetcher is None:
                raise InvalidRequest("video URLs are not fetched by this gateway", param="video.url")
            try:
                async with self.spool.writer(job_id) as writer:
                    await self.fetcher.fetch_into(url, writer.write)
                    await writer.finish()
            except ClientError as exc:
                raise video_fetch_error(exc) from exc
            return self.spool.path(job_id)
        return await self._rejecting(self.executor, decode_video_data_url, url, self.settings.max_bytes)

    async def cut(self, source: VideoSource, sampling: Sampling, encode: Encode) -> VideoCut:
        """The frames to judge, cut on the video threads within the time budget."""
        same = likeness(self.rule)
        return await self._rejecting(
            self.executor,
            lambda: cut_video(source, self.limits, sampling, same, budget_s=self.settings.cut_budget_s,
                              encode=encode),
        )

    async def cut_once(
        self, moderation: ModerationService, request: JobRequest, job_id: str, answered: Answered | None
    ) -> VideoCut:
        """The job's cut: the one an earlier attempt kept, else cut now (each judged frame shaped onto the
        engine's token grid as it is decoded), kept with the job, and the spooled file deleted."""
        kept = await answered.cut() if answered is not None else None
        if kept is not None:
            try:
                return cut_from_kept(kept)
            except msgspec.DecodeError:  # kept by a gateway whose cut had other fields: cut it again
                log.warning("job %s: its kept cut could not be read; cutting the video again", job_id)
        source = await self.source(request, job_id, answered)
        started = time.monotonic()
        encode = functools.partial(shape_picture, grid=moderation.grid,
                                   jpeg_quality=moderation.settings.shaping.jpeg_quality)
        cut = await self.cut(source, self.sampling(request), encode)
        moderation.recorder.video_cut(time.monotonic() - started, cut.coverage)
        if answered is not None:
            await answered.save_cut(kept_cut(cut))
        if isinstance(source, Path):
            await self.spool.discard(job_id)
        return cut

    async def _rejecting(self, executor: Executor, function: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, function, *args)
        except VideoRejected as exc:
            raise video_rejection(exc) from exc
        except ImageRejected as exc:  # a frame the token grid cannot take (past 200:1)
            error = image_rejection(exc)
            error.param = "video"
            raise error from exc

    async def moderate(
        self,
        moderation: ModerationService,
        request: JobRequest,
        caller: Caller,
        priority: int,
        progress: Progress,
        answered: Answered | None = None,
    ) -> VideoModerationResponse:
        """Cut the video (once: see :meth:`cut_once`) and judge it; its frames in chunks (progress told after
        each), then segments.

        The chunks run in one task group: the first that fails cancels the others (no engine call is made
        for an attempt that has already failed). Each frame's ``decision_id`` is stable per job and frame,
        and each chunk's answer is kept with the job (``answered``): a retried attempt takes the chunks
        already judged from there and asks only for the rest."""
        cut = await self.cut_once(moderation, request, caller.job_id or request.video_id, answered)
        total = len(cut.covered)
        await progress(0, total)
        size = max(8, request.packing or moderation.settings.shaping.packing_k)
        starts = range(0, len(cut.frames), size)
        kept = await answered.load() if answered is not None else {}
        done = 0

        async def judge(start: int) -> KeyframeBatchResponse:
            nonlocal done
            chunk = cut.frames[start:start + size]
            name = chunk_name(chunk)
            if name in kept:
                answer = KeyframeBatchResponse.model_validate_json(kept[name])
            else:
                answer = await self._judge(moderation, request, caller, priority, chunk, start)
                if answered is not None:  # kept even if the attempt is cancelled now: its rows are logged
                    with contextlib.suppress(ClientError, ServerSideError):
                        await asyncio.shield(answered.save(name, answer.model_dump_json()))
            done += sum(start <= covered.judged < start + size for covered in cut.covered)
            await progress(done, total)
            return answer

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(judge(start)) for start in starts]
        except ExceptionGroup as failed:  # the first chunk's failure, as the worker retries or fails it
            raise failed.exceptions[0] from None
        return video_response([task.result() for task in tasks], cut)

    @staticmethod
    async def _judge(
        moderation: ModerationService, request: JobRequest, caller: Caller, priority: int,
        chunk: list[CutFrame], start: int,
    ) -> KeyframeBatchResponse:
        """One chunk of the cut's frames through the keyframe batch path, each with its stable decision id."""
        frames = [EncodedKeyframe(frame.jpeg, frame.timestamp_ms) for frame in chunk]
        options = BatchOptions(packing=request.packing, thinking=request.thinking, model=request.model,
                               tags=request.tags, priority=request.priority)
        job = caller.job_id or request.video_id
        return await moderate_encoded_keyframes(
            moderation, request.video_id, frames, options, caller, priority=priority,
            decision_ids=[frame_decision_id(job, frame.timestamp_ms, start + number)
                          for number, frame in enumerate(chunk)],
        )


def video_response(answers: list[KeyframeBatchResponse], cut: VideoCut) -> VideoModerationResponse:
    """The chunks' answers as one keyframes document of the video's covered frames (a reused frame carries
    its judged look-alike's verdict, marked ``reused``), with its segments and coverage."""
    judged = [frame for answer in answers for frame in answer.frames]
    results: list[KeyframeResult] = []
    for index, covered in enumerate(cut.covered):
        made = judged[covered.judged]
        update: dict[str, Any] = {"index": index, "timestamp_ms": covered.timestamp_ms}
        if covered.reused:
            update["modgate"] = made.modgate.model_copy(update={"reused": "near"})
        results.append(made.model_copy(update=update))
    verdicts = [
        FrameVerdict(
            index=frame.index,
            timestamp_ms=frame.timestamp_ms or 0,
            action=frame.modgate.action,
            categories=tuple(sorted(name for name, flagged in frame.categories.items() if flagged)),
            confidence=frame.modgate.confidence,
        )
        for frame in results
    ]
    duration_ms = cut.info.duration_ms
    segments = [
        VideoSegment(start_ms=s.start_ms, end_ms=s.end_ms, action=cast("Action", s.action),
                     categories=list(s.categories), frames=list(s.frames), confidence=s.confidence)
        for s in merge_segments(verdicts, duration_ms)
    ]
    first, coverage = answers[0], cut.coverage
    return VideoModerationResponse(
        id=first.id,
        video_id=first.video_id,
        model=first.model,
        verdict=video_verdict(results),
        frames=results,
        packing=first.packing,
        engine_requests=sum(answer.engine_requests for answer in answers),
        reused_frames=sum(answer.reused_frames for answer in answers) + coverage.reused,
        duration_ms=duration_ms,
        segments=segments,
        coverage=VideoCoverage(
            max_gap_ms=coverage.max_gap_ms, frames_decoded=coverage.frames_decoded,
            candidates=coverage.candidates, sent=coverage.judged, reused=coverage.reused,
            complete=coverage.complete,
        ),
    )

