"""One video's keyframes as one batch: a verdict per frame and one for the video, sync or as a job.

``POST /v1/videos/{video_id}/keyframes`` answers it at once; ``POST /v1/jobs`` takes the same body (plus the
video id and an optional webhook) and its result is the same document. The frames of a batch belong to one
caller, hence one tenant: the gateway may pack them ``packing`` to an engine request (one structured output
with a verdict per frame) and reuses verdicts of frames it has seen (exact or near duplicates), which a
video's keyframes often are. The video is blocked if any frame is, sent to review if any frame is, allowed
otherwise.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.caller import Caller
from gateway.errors import InvalidRequest
from gateway.moderation.frame_input import EncodedFrame, FramesRequest
from gateway.moderation.service import ModerationService
from gateway.policy.rules import Mode
from gateway.wire import (
    ImageURL,
    ImageURLPart,
    ModerationRequest,
    ModerationResult,
    RequestOptions,
    TextPart,
)
from shaping.verdict import Action

VIDEO_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"  # the OpenAPI document states it too
_VIDEO_ID = re.compile(VIDEO_ID_PATTERN)


def check_video_id(video_id: str) -> None:
    """A video id is 1 to 200 of ``A-Z a-z 0-9 . _ : -`` (it goes into logs and shadow records)."""
    if not _VIDEO_ID.fullmatch(video_id):
        raise InvalidRequest("video_id must be 1 to 200 of A-Z a-z 0-9 . _ : -", param="video_id")


class Keyframe(BaseModel):
    """One keyframe of the video."""

    model_config = ConfigDict(extra="forbid", strict=True)

    image_url: ImageURL
    timestamp_ms: int | None = Field(default=None, ge=0)  # where in the video; echoed back


class KeyframeBatchRequest(BaseModel):
    """The body of ``POST /v1/videos/{video_id}/keyframes`` (and, with ``video_id``, of ``POST /v1/jobs``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    frames: list[Keyframe] = Field(min_length=1)
    packing: int | None = Field(default=None, ge=1, le=16)  # frames per engine request; default the setting
    # honoured where the thinking policy lets callers choose
    thinking: Mode | None = None
    model: str | None = None
    tags: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=16)
    priority: int = Field(default=0, ge=-10, le=10)


class FramePosition(BaseModel):
    """Where a keyframe is: its place in the batch and, if the caller said, in the video."""

    index: int
    timestamp_ms: int | None


# Pydantic lays out inherited fields from the last base to the first: the position comes first on the wire,
# then the fields of a moderation result, as ``{"index", "timestamp_ms", "flagged", ..., "modgate"}``.
class KeyframeResult(ModerationResult, FramePosition):
    """One frame's verdict: the fields of a moderation result, plus where the frame is."""


class VideoVerdict(BaseModel):
    """The video as a whole: block if any frame is blocked, review if any frame needs review, else allow."""

    action: Action
    flagged: bool
    categories: list[str]  # named by the frames that decided the action
    blocked_frames: list[int]
    review_frames: list[int]


class KeyframeBatchResponse(BaseModel):
    """The answer: the video's verdict, each frame's, and what the batch cost the engine."""

    id: str
    object: Literal["video.keyframes.moderation"] = "video.keyframes.moderation"
    video_id: str
    model: str
    verdict: VideoVerdict
    frames: list[KeyframeResult]
    packing: int  # frames per engine request
    engine_requests: int  # engine calls the batch took
    reused_frames: int  # frames whose verdict was reused instead of asked of the engine


def video_verdict(frames: list[KeyframeResult]) -> VideoVerdict:
    """Block if any frame is blocked, review if any frame needs review, else allow."""
    blocked = [frame.index for frame in frames if frame.modgate.action == "block"]
    review = [frame.index for frame in frames if frame.modgate.action == "review"]
    deciding = blocked or review
    # A blocked frame's categories are the ones it blocks for (its scores are probabilities, and every
    # category may have some); a review names its categories by a score only when no block decides.
    categories = sorted({
        name for frame in frames if frame.index in deciding
        for name, score in frame.category_scores.items()
        if (frame.categories.get(name, False) if blocked else score > 0)
    })
    action: Action = "block" if blocked else "review" if review else "allow"
    return VideoVerdict(action=action, flagged=action != "allow", categories=categories,
                        blocked_frames=blocked, review_frames=review)


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How a batch is judged, whoever holds its frames: a posted body, or a video job with its cut."""

    packing: int | None = None
    thinking: Mode | None = None
    model: str | None = None
    tags: Sequence[str] = ()
    priority: int = 0


@dataclass(frozen=True, slots=True)
class EncodedKeyframe:
    """A keyframe the gateway holds encoded already (a video job's cut JPEG) and where it is in the video."""

    data: bytes
    timestamp_ms: int | None


async def moderate_keyframes(
    moderation: ModerationService,
    video_id: str,
    batch: KeyframeBatchRequest,
    caller: Caller,
    requested: Mode | None,
    *,
    priority: int | None = None,
    decision_ids: Sequence[str] | None = None,
) -> KeyframeBatchResponse:
    """Judge one video's keyframes: the sync route and the job worker both answer this document.

    ``priority``: the admission priority, when not the body's (jobs queue behind live calls).
    ``decision_ids``: one per frame, its verdict's ``decision_id`` (default: fresh ones).
    """
    options = BatchOptions(packing=batch.packing, thinking=batch.thinking, model=batch.model, tags=batch.tags,
                           priority=batch.priority)
    parts: list[ImageURLPart | TextPart] = [
        ImageURLPart(type="image_url", image_url=frame.image_url) for frame in batch.frames
    ]
    request = ModerationRequest(input=parts, model=batch.model, modgate=_options(video_id, options, priority))
    timestamps = [frame.timestamp_ms for frame in batch.frames]
    return await _moderate_batch(moderation, video_id, options, request, timestamps, caller, requested,
                                 decision_ids)


async def moderate_encoded_keyframes(
    moderation: ModerationService,
    video_id: str,
    frames: Sequence[EncodedKeyframe],
    options: BatchOptions,
    caller: Caller,
    *,
    priority: int | None = None,
    decision_ids: Sequence[str] | None = None,
) -> KeyframeBatchResponse:
    """Judge keyframes the gateway holds as bytes (a video job's cut) as posted ones are, with no ``data:``
    URL written and decoded again between: the same shaping, reuse, engine calls and decision log."""
    request = FramesRequest(
        input=[EncodedFrame(frame.data) for frame in frames], model=options.model,
        modgate=_options(video_id, options, priority),
    )
    timestamps = [frame.timestamp_ms for frame in frames]
    return await _moderate_batch(moderation, video_id, options, request, timestamps, caller, None,
                                 decision_ids)


def _options(video_id: str, batch: BatchOptions, priority: int | None) -> RequestOptions:
    """A batch's options as its moderation request's (``priority``: the admission's, if not the batch's)."""
    return RequestOptions(
        thinking=batch.thinking,
        video_id=video_id,
        tags=list(batch.tags),
        priority=batch.priority if priority is None else priority,
    )


async def _moderate_batch(
    moderation: ModerationService,
    video_id: str,
    batch: BatchOptions,
    request: ModerationRequest,
    timestamps: Sequence[int | None],
    caller: Caller,
    requested: Mode | None,
    decision_ids: Sequence[str] | None,
) -> KeyframeBatchResponse:
    """One batch's request through the moderation path, answered as one document of its frames."""
    packing = batch.packing or moderation.settings.shaping.packing_k
    answer = await moderation.moderate(request, caller, requested, packing=packing, decision_ids=decision_ids)
    frames = [
        KeyframeResult(index=index, timestamp_ms=timestamp_ms, **dict(result))
        for index, (timestamp_ms, result) in enumerate(zip(timestamps, answer.results, strict=True))
    ]
    fresh = {frame.modgate.request_id for frame in frames if frame.modgate.reused is None}
    return KeyframeBatchResponse(
        id=f"vkf-{uuid.uuid4().hex}",
        video_id=video_id,
        model=answer.model,
        verdict=video_verdict(frames),
        frames=frames,
        packing=packing,
        engine_requests=len(fresh),
        reused_frames=sum(frame.modgate.reused is not None for frame in frames),
    )
