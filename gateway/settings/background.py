"""Background work and its state: jobs, videos, review, the decision log, shadow and quality records."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from gateway.settings.request_path import HostList


class JobSettings(BaseModel):
    """Keyframe batches submitted as jobs (gateway/jobs/): durable in Redis streams when Redis is set."""

    max_frames: int = Field(default=64, ge=1, le=1024)
    max_backlog: int = Field(default=10_000, ge=1)  # jobs queued or running before a submission gets 429
    concurrency: int = Field(default=2, ge=1, le=64)  # jobs worked at once by each gateway
    priority: int = Field(default=5, ge=-10, le=10)  # admission priority of job frames (live calls use 0)
    claim_idle_s: float = Field(default=60.0, gt=0)  # a job silent this long on its gateway is taken over
    max_attempts: int = Field(default=5, ge=1, le=50)  # engine failures before a job is marked failed
    retry_wait_s: float = Field(default=1.0, gt=0)  # first back-off between attempts (doubling, jittered)
    result_ttl_s: int = Field(default=7 * 86400, ge=60)  # how long a finished job and its key are kept
    webhook_secret: SecretStr | None = None  # signs webhooks; unset: webhook_url is refused
    webhook_allowlist: HostList = Field(default_factory=list)  # hosts a webhook may go to (operator-trusted)
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    webhook_attempts: int = Field(default=5, ge=1, le=20)
    # At shutdown: how long running jobs may go on; the rest go back to the stream for another gateway.
    stop_grace_s: float = Field(default=10.0, ge=0, le=600)
    # Replicas that must hold a job (WAIT) before it is answered 202 or its completion counts (0: none).
    wait_replicas: int = Field(default=0, ge=0, le=16)  # Unset with a redis+sentinel:// URL: 1.
    wait_timeout_ms: int = Field(default=1000, ge=1, le=4_000)  # WAIT's limit: within Redis's 5 s timeout

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or value.get_secret_value() == "":
            return None
        if len(value.get_secret_value()) < 16:
            raise ValueError("MODGATE_JOBS__WEBHOOK_SECRET must be at least 16 characters")
        return value


class VideoSettings(BaseModel):
    """Videos posted as jobs (gateway/jobs/video.py, cut by shaping/video/): their limits and the cut."""

    # A JSON body carries the video base64-encoded (4/3 of its size) within MODGATE_SHAPING__MAX_BODY_BYTES.
    max_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_duration_s: float = Field(default=600.0, gt=0)
    max_pixels: int = Field(default=3840 * 2160, ge=1)  # per frame: 4K
    max_gap_s: float = Field(default=1.0, ge=0.04, le=60)  # a judged (or look-alike) frame in every stretch
    max_fps: float = Field(default=1.0, gt=0, le=60)  # shot changes taken per second of video at most
    scene_threshold: float = Field(default=0.03, ge=0, le=1)  # FFmpeg scdet's score/100 of a shot change
    cut_budget_s: float = Field(default=120.0, gt=0)  # the cut of one video, after which the job fails
    cut_workers: int = Field(default=1, ge=1, le=16)  # videos cut at once (threads of their own)
    # Jobs queued or running before a video submission gets 429 video_cut_busy: each may wait for a cut
    # thread, a posted one with its video in the spool (this many x max_bytes on disk at most).
    max_queued_jobs: int = Field(default=64, ge=1)
    # A submission's probe (its packets demuxed, no frame decoded): threads of their own, never behind a cut;
    # as many more may wait, then 429 video_probe_busy; one taking longer fails video_probe_timeout.
    probe_workers: int = Field(default=2, ge=1, le=16)
    probe_timeout_s: float = Field(default=10.0, gt=0, le=300)
    # The decoded-frame cap: this many frames a second of max_duration_s (36,000 at 600 s by default);
    # past it the cut stops with video_too_large, whatever the container says of its frame rate.
    max_decoded_fps: int = Field(default=60, ge=1, le=1000)
    fetch_timeout_s: float = Field(default=60.0, gt=0, le=600)  # a video URL's whole download
    # Where a posted or fetched video waits as a file until it is cut (then only its cut frames wait, in the
    # job store): with several replicas, a volume they all mount, since any replica may cut it (docs/jobs.md).
    spool_dir: Path = Path("var/videos")


class ReviewSettings(BaseModel):
    """The review queue (gateway/review/): frames people label, in Redis streams when Redis is set."""

    enabled: bool = True
    # A block or allow whose confidence is under this goes to the queue as unsure (0: none do). The
    # per-tenant moderation policy's ``review_below`` takes over where it is set.
    review_below: float = Field(default=0.0, ge=0, le=1)
    # The share of confident verdicts sampled for audit, so accuracy is measured where the model is sure.
    audit_sample_rate: float = Field(default=0.0, ge=0, le=1)
    # The share of audit samples queued twice (two items, one decision), so two reviewers label the same
    # frame and the weekly report gives their agreement (Cohen's kappa) beside the model's accuracy.
    double_label_share: float = Field(default=0.0, ge=0, le=1)
    # A claim not labelled this long returns to the queue: the next reviewer who asks takes it over.
    claim_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    # How long an item (and its frame) is kept unlabelled; a labelled item's frame is deleted at once.
    retention_s: int = Field(default=7 * 86400, ge=60, le=90 * 86400)
    # An alert fires when the oldest waiting item is older than this (deploy/monitoring/).
    oldest_alert_s: float = Field(default=3600.0, gt=0)
    # Without Redis: items kept in memory, each with its frame (~100 KB); past this the oldest is dropped.
    memory_max_items: int = Field(default=1000, ge=1, le=100_000)
    # Replicas that must hold a queued item before its verdict is answered (else modgate_review_unreplicated)
    wait_replicas: int = Field(default=0, ge=0, le=16)  # Unset with a redis+sentinel:// URL: 1.
    wait_timeout_ms: int = Field(default=200, ge=1, le=4_000)  # WAIT's limit: within Redis's 5 s timeout


class DecisionSettings(BaseModel):
    """The decision log (docs/decisions.md): each decision on a Redis stream, then in daily Parquet files."""

    stream: str = Field(default="modgate:decisions", min_length=1)  # with MODGATE_REDIS__URL
    archive_dir: Path = Path("var/decisions")  # one folder of Parquet files per UTC day
    archive_after_s: float = Field(default=3600.0, ge=0)  # stream entries older than this move to Parquet
    archive_interval_s: float = Field(default=300.0, gt=0)  # how often a replica tries to move them
    retention_days: int = Field(default=400, ge=1)  # day folders older than this are deleted
    redis_timeout_s: float = Field(default=0.5, gt=0, le=4.0)  # an append waits no longer: within Redis's 5 s
    # a failed append is tried again in the background (never on the answer's time) this many times in all,
    # for at most this long, then counted in modgate_decisions_unlogged_total
    retry_attempts: int = Field(default=8, ge=1)
    retry_timeout_s: float = Field(default=60.0, gt=0)
    # Replicas that must hold an append (WAIT): one not held in time is tried again like a failed one.
    wait_replicas: int = Field(default=0, ge=0, le=16)  # Unset with a redis+sentinel:// URL: 1.


class ShadowSettings(BaseModel):
    """A second engine for shadow pairs: the policy's ``shadow_share`` of live frames is judged there too, in
    the live thinking mode and verdict format, so one engine's verdicts are measured against the other's."""

    engine_url: str | None = None  # unset: shadow pairs only on the live engines, in the other thinking mode
    # VerdictRecord.engine of its records until its kind is detected (GET /props)
    engine_kind: Literal["vllm", "llamacpp"] = "llamacpp"
    max_inflight: int = Field(default=8, ge=1, le=1024)  # the second engine's cap (llama.cpp: its slots)

    @field_validator("engine_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"MODGATE_SHADOW__ENGINE_URL must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


class QualitySettings(BaseModel):
    """Where shadow pairs (the policy's ``shadow_share`` of live frames, judged in both modes) are kept."""

    records_dir: Path = Path("var/quality/records")  # one JSONL file per ISO week, read by the weekly report
    redis_stream: str = "modgate:quality:records"  # mirrored there when MODGATE_REDIS__URL is set
