"""The jobs' vocabulary: the wire models a caller sees, the record a store keeps, a stream delivery."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.moderation.keyframe_batch import Keyframe, KeyframeBatchRequest, KeyframeBatchResponse
from gateway.wire import ModerationResponse
from shaping.verdict import Action

JobStatus = Literal["queued", "running", "succeeded", "failed"]
WebhookStatus = Literal["pending", "delivered", "failed"]
FINISHED: Final = frozenset({"succeeded", "failed"})
REVIEW_FIELD: Final = "review:"  # a job hash field per labelled frame: ``review:<request id>``


# --- wire ----------------------------------------------------------------------------------------------


class VideoSource(BaseModel):
    """The video itself: an ``https://`` URL (fetched as image URLs are) or a ``data:video/…;base64,`` URL."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(min_length=1)


class VideoSampling(BaseModel):
    """How densely a video is cut; each unset field takes its setting (``MODGATE_VIDEOS__…``, ``max_frames``
    ``MODGATE_JOBS__MAX_FRAMES``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_gap_s: float | None = Field(default=None, ge=0.04, le=60)  # a longer gap than the setting's only
    max_fps: float | None = Field(default=None, gt=0, le=60)  # shot changes taken per second at most
    scene_threshold: float | None = Field(default=None, ge=0, le=1)  # scdet's score / 100; 0: the clock only
    max_frames: int | None = Field(default=None, ge=1, le=1024)  # distinct frames judged at most
    # More distinct frames than max_frames: false (the default) fails the job (video_too_many_frames); true
    # judges a sparser sample (every other frame dropped as often as needed) and the coverage says so.
    allow_sparser: bool = False


class JobRequest(KeyframeBatchRequest):
    """``POST /v1/jobs``: the body of ``POST /v1/videos/{video_id}/keyframes``, plus the video's id and an
    optional webhook; moderated in the background, its result the document the sync call answers. A video
    (``video``, optionally ``sampling``) may come in place of ``frames``: the gateway cuts its keyframes."""

    # Optional here, unlike the sync route's body: a video job sends ``video`` instead (exactly one of them).
    frames: list[Keyframe] | None = Field(default=None, min_length=1)  # type: ignore[assignment]  # None only with a video (checked below); the worker sends only frame jobs down the frames path
    video_id: str = Field(min_length=1, max_length=200)
    webhook_url: str | None = Field(default=None, min_length=1, max_length=2048)
    video: VideoSource | None = None
    sampling: VideoSampling | None = None

    @model_validator(mode="after")
    def _frames_or_a_video(self) -> JobRequest:
        if (self.frames is None) == (self.video is None):
            raise ValueError("send either frames or a video, not both and not neither")
        if self.sampling is not None and self.video is None:
            raise ValueError("sampling applies to a video only")
        return self

    @field_validator("frames", mode="before")
    @classmethod
    def _content_parts_are_keyframes(cls, value: object) -> object:
        """The earlier job body's frames, OpenAI content parts (``{"type": "image_url", "image_url": …}``),
        are keyframes without a timestamp: still accepted."""
        if not isinstance(value, list):
            return value
        return [
            {key: item[key] for key in item if key != "type"}
            if isinstance(item, dict) and item.get("type") == "image_url" else item
            for item in value
        ]


class JobError(BaseModel):
    """Why a job failed, in the OpenAI error shape's fields."""

    message: str
    type: str
    code: str


class JobProgress(BaseModel):
    """How far a video job is: frames judged of the frames cut."""

    frames_done: int
    frames_total: int


class VideoSegment(BaseModel):
    """A time range of one verdict: consecutive frames of one action and one category set."""

    start_ms: int
    end_ms: int  # where the next segment starts; the last one's, the video's duration
    action: Action
    categories: list[str]
    frames: list[int]  # indices into ``frames``
    confidence: float | None  # the lowest of its frames' confidences (null when none has one)


class VideoCoverage(BaseModel):
    """How well the judged frames cover the video, as decoded."""

    max_gap_ms: int  # the longest any decoded frame lies after the last judged (or reused) frame before it
    frames_decoded: int
    candidates: int  # frames covered: judged, or reusing a judged look-alike's verdict
    sent: int  # frames sent to the engine (the verdict cache may still have answered some)
    reused: int  # covered frames whose verdict is a judged look-alike's (no engine call)
    complete: bool  # every stretch of max_gap_s covered; false only when a sparser sample was asked for


class VideoModerationResponse(KeyframeBatchResponse):
    """A video job's result: the keyframes document of the covered frames, with the video's duration (its
    decoded frames'), its segments and its coverage."""

    duration_ms: int
    segments: list[VideoSegment]
    coverage: VideoCoverage | None = None  # null on results made before coverage was measured


class WebhookState(BaseModel):
    """Where a job's result is posted, and how that went."""

    url: str
    status: WebhookStatus
    attempts: int


class JobReview(BaseModel):
    """A person's decision on one of the job's frames, beside the model's (gateway/review/)."""

    request_id: str  # the frame's result's ``modgate.request_id``
    action: Action
    categories: list[str]
    model_action: Action
    model_categories: list[str]
    agrees: bool
    labelled_at: float


class Job(BaseModel):
    """A job as its caller sees it; ``result`` once it has succeeded, ``error`` once it has failed."""

    id: str
    object: Literal["moderation.job"] = "moderation.job"
    status: JobStatus
    video_id: str
    frames: int  # a video job's: 0 until it is cut
    durable: bool  # false: kept in this gateway's memory only, lost on restart
    created_at: int
    updated_at: int
    completed_at: int | None = None
    attempts: int = 0
    # The document POST /v1/videos/{video_id}/keyframes answers; a job finished before that change kept
    # the moderation response it was given then.
    result: VideoModerationResponse | KeyframeBatchResponse | ModerationResponse | None = None
    error: JobError | None = None
    progress: JobProgress | None = None  # a video job's, once it is cut
    webhook: WebhookState | None = None
    reviews: list[JobReview] = Field(default_factory=list)  # people's labels of its frames, as they come


# --- the stored record ---------------------------------------------------------------------------------


@dataclass
class JobRecord:
    """A job as stored: every field a string-able value (one Redis hash field each)."""

    id: str
    tenant: str
    fingerprint: str  # SHA-256 of the request: a replayed idempotency key must carry the same request
    video_id: str
    frames: int
    status: JobStatus = "queued"
    frames_done: int | None = None  # a video job's progress, once it is cut
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
    # a posted video's reference (gateway/jobs/spool.py's SpooledVideo, as JSON): the file it waits in
    video_file: str | None = None
    # request id → a JobReview's JSON; stored as hash fields ``review:<request id>`` (each label its own)
    reviews: dict[str, str] = field(default_factory=dict)

    def to_hash(self) -> dict[str, str]:
        """The record as Redis hash fields (None fields left out)."""
        values = {
            f.name: str(getattr(self, f.name))
            for f in fields(self) if f.name != "reviews" and getattr(self, f.name) is not None
        }
        return values | {f"{REVIEW_FIELD}{rid}": review for rid, review in self.reviews.items()}

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> JobRecord:
        """Read a Redis hash back."""
        values = {as_text(k): as_text(v) for k, v in raw.items()}
        numbers = {
            "frames",
            "frames_done",
            "created_at",
            "updated_at",
            "completed_at",
            "attempts",
            "completions",
            "webhook_attempts",
        }
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {
            name: int(value) if name in numbers else value
            for name, value in values.items() if name in known and name != "reviews"
        }
        reviews = {
            name.removeprefix(REVIEW_FIELD): value
            for name, value in values.items() if name.startswith(REVIEW_FIELD)
        }
        return cls(**kwargs, reviews=reviews)

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
            result=None if self.result is None else _job_result(self.result),
            error=None if self.error is None else JobError.model_validate_json(self.error),
            progress=None if self.frames_done is None
            else JobProgress(frames_done=self.frames_done, frames_total=self.frames),
            webhook=None
            if self.webhook_url is None
            else WebhookState(
                url=self.webhook_url, status=self.webhook_status or "pending", attempts=self.webhook_attempts
            ),
            reviews=sorted((JobReview.model_validate_json(r) for r in self.reviews.values()),
                           key=lambda review: review.labelled_at),
        )


def _job_result(stored: str) -> VideoModerationResponse | KeyframeBatchResponse | ModerationResponse:
    if '"segments":' in stored:
        return VideoModerationResponse.model_validate_json(stored)
    try:
        return KeyframeBatchResponse.model_validate_json(stored)
    except ValidationError:
        return ModerationResponse.model_validate_json(stored)  # finished before jobs answered batches


@dataclass(frozen=True, slots=True)
class Delivery:
    """A stream entry handed to this gateway: the job to work."""

    entry_id: str
    job_id: str


def new_job_id() -> str:
    """A fresh job id (``job_`` and 32 hex digits): chosen before a posted video is spooled (it names it)."""
    return f"job_{uuid.uuid4().hex}"


def unix_now() -> int:
    """Now, in whole seconds since the epoch (the jobs' timestamps)."""
    return int(time.time())


def as_text(value: bytes | str) -> str:
    """A Redis reply as text."""
    return value.decode() if isinstance(value, bytes) else value
