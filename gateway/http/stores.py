"""Where each part of the gateway keeps its state: in Redis when it is configured, else this process's memory.

One function per part, called once by :func:`gateway.http.services.open_services` with the service's one Redis
client (None without Redis).
"""

from __future__ import annotations

from concurrent.futures import Executor

import redis.asyncio as aioredis

from contracts.records import JsonlRecordStore, MirroredRecordStore, RecordStore, RedisRecordStore
from gateway.decisions.log import DecisionLog, MemoryDecisionLog, RedisDecisionLog, Unlogged
from gateway.decisions.questions import MemoryQuestionLog, QuestionLog, RedisQuestionLog
from gateway.drain import Drain
from gateway.jobs.service import JobService
from gateway.jobs.store import JobStore
from gateway.jobs.store_memory import MemoryJobStore
from gateway.jobs.store_redis import RedisJobStore
from gateway.jobs.video import VideoJobs
from gateway.jobs.webhooks import WebhookSender
from gateway.moderation.remote_images import RemoteImageFetcher
from gateway.moderation.service import ModerationService
from gateway.moderation.verdict_cache import (
    MemoryVerdictCache,
    NearDuplicateRule,
    RedisVerdictCache,
    VerdictCache,
)
from gateway.policy.rules import PolicyStore
from gateway.policy.store import MemoryPolicyStore, RedisPolicyStore
from gateway.review.service import ReviewQueue
from gateway.review.store import ReviewStore
from gateway.review.store_memory import MemoryReviewStore
from gateway.review.store_redis import RedisReviewStore
from gateway.series.metrics import GatewayMetrics
from gateway.series.review import ReviewMetrics
from gateway.settings import Settings


def policy_store(settings: Settings, state: aioredis.Redis | None) -> PolicyStore:
    """The policy document: shared by every replica in Redis when it is configured, else this process's."""
    if state is None:
        return MemoryPolicyStore()
    group = settings.policy
    return RedisPolicyStore(
        state,
        key_prefix=group.key_prefix,
        reload_interval_s=group.reload_interval_s,
        timeout_s=group.redis_timeout_s,
        reconnect_interval_s=group.reconnect_interval_s,
        audit_max_entries=group.audit_max_entries,
    )


def job_service(
    settings: Settings,
    state: aioredis.Redis | None,
    moderation: ModerationService,
    executor: Executor,
    remote_images: RemoteImageFetcher | None,
    drain: Drain,
    videos: VideoJobs,
) -> JobService:
    """The job service: its jobs durable in Redis streams when Redis is configured; webhooks with a secret."""
    group = settings.jobs
    store: JobStore = (
        MemoryJobStore()
        if state is None
        else RedisJobStore(state, claim_idle_s=group.claim_idle_s, ttl_s=group.result_ttl_s,
                           wait_replicas=group.wait_replicas, wait_timeout_ms=group.wait_timeout_ms)
    )
    secret = group.webhook_secret
    webhooks = (
        None
        if secret is None
        else WebhookSender(
            secret.get_secret_value(), timeout_s=group.webhook_timeout_s, attempts=group.webhook_attempts
        )
    )
    return JobService(store, group, moderation, executor, remote_images=remote_images, webhooks=webhooks,
                      accepting=lambda: not drain.active, videos=videos)


def review_queue(
    settings: Settings, state: aioredis.Redis | None, metrics: GatewayMetrics
) -> ReviewQueue:
    """The review queue: durable in Redis streams when Redis is configured, else this process's memory."""
    group = settings.review
    store: ReviewStore = (
        MemoryReviewStore(claim_timeout_s=group.claim_timeout_s, retention_s=group.retention_s,
                          max_items=group.memory_max_items)
        if state is None
        else RedisReviewStore(state, claim_timeout_s=group.claim_timeout_s, retention_s=group.retention_s,
                              wait_replicas=group.wait_replicas, wait_timeout_ms=group.wait_timeout_ms)
    )
    return ReviewQueue(store, group, metrics=ReviewMetrics(metrics.registry, group.oldest_alert_s))


def near_duplicates(settings: Settings) -> NearDuplicateRule:
    """When two frames count as one picture: for the verdict cache and between a video's frames."""
    shaping = settings.shaping
    return NearDuplicateRule(shaping.near_duplicate_distance, shaping.near_duplicate_colour_delta)


def verdict_cache(settings: Settings, state: aioredis.Redis | None) -> VerdictCache:
    """Reused verdicts: shared in Redis when it is configured, else this process's memory."""
    shaping = settings.shaping
    rule = near_duplicates(settings)
    if state is None:
        return MemoryVerdictCache(shaping.verdict_cache_ttl_s, shaping.verdict_cache_max_entries, rule)
    return RedisVerdictCache(state, shaping.verdict_cache_ttl_s, rule)


def quality_records(settings: Settings, state: aioredis.Redis | None) -> RecordStore:
    """Shadow pairs: weekly JSONL files, mirrored to a Redis stream when Redis is configured."""
    files = JsonlRecordStore(settings.quality.records_dir)
    if state is None:
        return files
    return MirroredRecordStore(files, RedisRecordStore(state, stream=settings.quality.redis_stream))


def decision_log(settings: Settings, state: aioredis.Redis | None, unlogged: Unlogged) -> DecisionLog:
    """Every answered verdict and label: a Redis stream when Redis is configured, else in memory."""
    if state is None:
        return MemoryDecisionLog(settings.decisions, unlogged)
    return RedisDecisionLog(state, settings.decisions, unlogged)


def question_log(settings: Settings, state: aioredis.Redis | None, unlogged: Unlogged) -> QuestionLog:
    """One row per Decisions request, kept as the decision log keeps its rows."""
    if state is None:
        return MemoryQuestionLog()
    return RedisQuestionLog(state, settings.decisions, unlogged)
