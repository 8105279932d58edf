"""Video jobs: a video in (a URL or a ``data:`` URL), its keyframes cut, judged as posted keyframes are,
and merged into segments.

At submission the cheap checks answer a clear 4xx at once: the URL against the allowlist, a ``data:`` URL's
size and a container probe (a still image, no video stream, over the duration or pixel limits). The worker
then fetches a URL (as image URLs are fetched: allowlist, public addresses only, the size capped while
streaming), cuts the frames on threads of their own (``shaping/video``, within a time budget) and sends
them through the keyframe batch path (shaping, packing, reuse, thinking policy, tenants, decision log) in
chunks, recording progress after each. A video refused then fails the job with the reason.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from gateway.caller import Caller
from gateway.errors import ClientError, InvalidRequest, PayloadTooLarge, UnprocessableImage, UnsupportedMedia
from gateway.jobs.models import JobRequest, VideoModerationResponse, VideoSegment
from gateway.moderation.keyframe_batch import (
    Keyframe,
    KeyframeBatchRequest,
    KeyframeBatchResponse,
    KeyframeResult,
    moderate_keyframes,
    video_verdict,
)
from gateway.moderation.remote_images import RemoteImageFetcher, is_remote_url
from gateway.moderation.service import ModerationService
from gateway.settings import JobSettings, VideoSettings
from gateway.wire import ImageURL
from shaping.verdict import Action
from shaping.video import (
    FrameVerdict,
    Sampling,
    VideoCut,
    VideoLimits,
    VideoRejected,
    cut_keyframes,
    decode_video_data_url,
    merge_segments,
    probe_video,
)

T = TypeVar("T")
Progress = Callable[[int, int], Awaitable[None]]
"""``(frames_done, frames_total)``: told after each chunk of frames is judged."""


def video_rejection(exc: VideoRejected) -> ClientError:
    """Translate a refused video into the gateway's client error of the same status."""
    kind: type[ClientError] = {413: PayloadTooLarge, 415: UnsupportedMedia, 422: UnprocessableImage}.get(
        exc.status, InvalidRequest
    )
    return kind(exc.message, code=exc.code, param="video")


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

    @property
    def limits(self) -> VideoLimits:
        """The limits of a video, from the settings."""
        s = self.settings
        return VideoLimits(max_bytes=s.max_bytes, max_duration_s=s.max_duration_s, max_pixels=s.max_pixels)

    def sampling(self, request: JobRequest) -> Sampling:
        """The request's sampling, each unset field its setting."""
        asked = request.sampling
        return Sampling(
            max_fps=asked.max_fps if asked and asked.max_fps is not None else self.settings.max_fps,
            scene_threshold=asked.scene_threshold if asked and asked.scene_threshold is not None
            else self.settings.scene_threshold,
            max_frames=min(self.jobs.max_frames, asked.max_frames if asked and asked.max_frames else 1 << 30),
        )

    async def check(self, request: JobRequest) -> None:
        """At submission: what can be told without decoding a frame (a clear 4xx at once)."""
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
            self.fetcher.check_url(url)
            return
        if self.sampling(request).max_frames < 1:
            raise InvalidRequest("max_frames must be at least 1", param="sampling.max_frames")
        await self._rejecting(self._probe, url)

    def _probe(self, url: str) -> None:
        probe_video(decode_video_data_url(url, self.settings.max_bytes), self.limits)

    async def load(self, request: JobRequest) -> bytes:
        """The video's bytes: fetched (URL) or decoded (``data:`` URL)."""
        assert request.video is not None
        url = request.video.url
        if is_remote_url(url):
            if self.fetcher is None:
                raise InvalidRequest("video URLs are not fetched by this gateway", param="video.url")
            return await self.fetcher.fetch(url)
        return await self._rejecting(decode_video_data_url, url, self.settings.max_bytes)

    async def cut(self, data: bytes, sampling: Sampling) -> VideoCut:
        """The frames to judge, cut on the video threads within the time budget."""
        return await self._rejecting(
            lambda: cut_keyframes(data, self.limits, sampling, budget_s=self.settings.cut_budget_s)
        )

    async def _rejecting(self, function: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)
        except VideoRejected as exc:
            raise video_rejection(exc) from exc

    async def moderate(
        self,
        moderation: ModerationService,
        request: JobRequest,
        caller: Caller,
        priority: int,
        progress: Progress,
    ) -> VideoModerationResponse:
        """Load, cut and judge the video; its frames in chunks (progress told after each), then segments."""
        cut = await self.cut(await self.load(request), self.sampling(request))
        frames = [
            Keyframe(image_url=ImageURL(url=_jpeg_data_url(frame.jpeg)), timestamp_ms=frame.timestamp_ms)
            for frame in cut.frames
        ]
        await progress(0, len(frames))
        size = max(8, request.packing or moderation.settings.shaping.packing_k)
        chunks = [frames[start:start + size] for start in range(0, len(frames), size)]
        done = 0

        async def judge(chunk: list[Keyframe]) -> KeyframeBatchResponse:
            nonlocal done
            batch = KeyframeBatchRequest(
                frames=chunk, packing=request.packing, thinking=request.thinking, model=request.model,
                tags=request.tags, priority=request.priority,
            )
            answer = await moderate_keyframes(
                moderation, request.video_id, batch, caller, None, priority=priority
            )
            done += len(chunk)
            await progress(done, len(frames))
            return answer

        answers = await asyncio.gather(*(judge(chunk) for chunk in chunks))
        return video_response(answers, cut.info.duration_ms)


def video_response(answers: list[KeyframeBatchResponse], duration_ms: int) -> VideoModerationResponse:
    """The chunks' answers as one keyframes document of the whole video, with its segments."""
    results: list[KeyframeResult] = []
    for answer in answers:
        offset = len(results)
        results.extend(frame.model_copy(update={"index": offset + frame.index}) for frame in answer.frames)
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
    segments = [
        VideoSegment(start_ms=s.start_ms, end_ms=s.end_ms, action=cast("Action", s.action),
                     categories=list(s.categories), frames=list(s.frames), confidence=s.confidence)
        for s in merge_segments(verdicts, duration_ms)
    ]
    first = answers[0]
    return VideoModerationResponse(
        id=first.id,
        video_id=first.video_id,
        model=first.model,
        verdict=video_verdict(results),
        frames=results,
        packing=first.packing,
        engine_requests=sum(answer.engine_requests for answer in answers),
        reused_frames=sum(answer.reused_frames for answer in answers),
        duration_ms=duration_ms,
        segments=segments,
    )


def _jpeg_data_url(jpeg: bytes) -> str:
    return f"data:image/jpeg;base64,{base64.b64encode(jpeg).decode()}"
