"""The gateway's long-lived parts, built once per app by the lifespan and closed on its way out.

:func:`open_services` opens every client once, on one exit stack; the app's providers hand each part to the
handlers that name it (gateway/http/providers.py). Where each part keeps its state: gateway/http/stores.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial

import httpx
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from contracts.decisions import archive_missing
from gateway.decisions.log import DecisionArchiver, DecisionLog, RedisDecisionLog
from gateway.decisions.questions import QuestionLog
from gateway.decisions.rows import review_label_row
from gateway.drain import Drain
from gateway.engine.admission import AdmissionQueue
from gateway.engine.calls import CallFigures
from gateway.engine.client import EngineClient
from gateway.engine.first_request import FirstRequestProbe
from gateway.engine.pool import EnginePool
from gateway.engine.pool_build import build_engine_pool, register_pool_metrics
from gateway.engine.prefix_keeper import PrefixKeeper
from gateway.engine.startup_check import CheckTargets, EngineChecks
from gateway.http.auth import KeyRing
from gateway.http.console.guard import ConsoleGuard, SignInLimits, build_console_guard
from gateway.http.console.oidc import OidcSignIn
from gateway.http.keys_store import RedisKeyStore
from gateway.http.quotas import MemoryKeyframeRate, RedisKeyframeRate, TenantQuotas
from gateway.http.stores import (
    decision_log,
    job_service,
    near_duplicates,
    policy_store,
    quality_records,
    question_log,
    review_queue,
    verdict_cache,
)
from gateway.http.system_prompts import prefix_strategy_setting, system_prompt
from gateway.http.tenant_figures import TenantFigures
from gateway.http.tenants import ANONYMOUS_TENANT, TenantDirectory
from gateway.jobs.models import JobReview
from gateway.jobs.service import JobService
from gateway.jobs.video import VideoJobs
from gateway.moderation.engine_identity import EngineIdentity
from gateway.moderation.remote_images import VIDEOS, RemoteImageFetcher
from gateway.moderation.service import ModerationService
from gateway.moderation.shadow import SecondEngine, ShadowSampler
from gateway.moderation.shaping_pool import ShapingPool
from gateway.policy.rules import MODES, PolicyStore
from gateway.review.models import LabelledItem
from gateway.review.service import ReviewQueue
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.state import SOCKET_TIMEOUT_S, open_redis
from gateway.telemetry.recorder import RequestRecorder, VerdictRecorder
from gateway.telemetry.tracing import Telemetry, build_telemetry
from gateway.telemetry.windows import (
    Clock,
    EngineCacheScraper,
    EngineCacheWindow,
    RecentRequests,
    window_reading,
)
from shaping.prompt import load_system_prompt, prompt_version_for
from shaping.verdict import VERDICT_FORMATS

log = logging.getLogger("modgate.gateway")


class MissingEngine(ValueError):
    """The settings name no engine and no test transport stands in for one."""


@dataclass(frozen=True, slots=True)
class Services:
    """The app's long-lived parts as :func:`open_services` built them; each handler names the ones it uses."""

    settings: Settings
    keys: KeyRing
    engine: EngineClient  # the first engine's client (the pool holds every engine's)
    admission: AdmissionQueue  # the engines' one queue
    policies: PolicyStore
    metrics: GatewayMetrics
    moderation: ModerationService
    telemetry: Telemetry  # this app's OpenTelemetry providers and tracer
    recent: RecentRequests  # per-keyframe samples of the last telemetry.window_s seconds (GET /stats)
    engine_cache: EngineCacheScraper  # the engine's prefix-cache counters, differenced between scrapes
    jobs: JobService  # keyframe batches worked in the background (durable with Redis)
    engines: EnginePool  # every engine: a client, breaker and cap each, behind ``admission``
    quotas: TenantQuotas  # per-tenant keyframes a minute and requests at once (gateway/http/quotas.py)
    tenants: TenantFigures  # per-tenant figures for /stats, /metrics and the console
    console: ConsoleGuard  # failed console sign-ins and revoked sessions (shared in Redis when configured)
    review: ReviewQueue  # frames people label (gateway/review/: Redis streams when Redis is configured)
    drain: Drain  # set by SIGTERM: /readyz 503 while still serving
    # what each engine was found to lack at start (gateway/engine/startup_check.py)
    engine_checks: EngineChecks
    prefix: PrefixKeeper  # each engine's prefix strategy and priming (/readyz)
    # each engine's first tiny request, sent by /readyz once it is healthy (gateway/engine/first_request.py)
    first_request: FirstRequestProbe
    oidc: OidcSignIn | None  # the console's OpenID Connect sign-in (None: MODGATE_OIDC__ISSUER unset)
    question_log: QuestionLog  # one row per Decisions request


def _remote_images(settings: Settings) -> RemoteImageFetcher | None:
    group = settings.remote_images
    if not group.enabled:
        return None
    if not group.allowlist:
        log.warning("MODGATE_REMOTE_IMAGES__ENABLED is on but its allowlist is empty: every URL is refused")
    return RemoteImageFetcher(
        group.allowlist,
        max_bytes=group.max_bytes,
        timeout_s=group.timeout_s,
        max_redirects=group.max_redirects,
    )


def _video_fetcher(settings: Settings) -> RemoteImageFetcher | None:
    """Video URLs are fetched as image URLs are (the same allowlist), with the video limits."""
    group = settings.remote_images
    if not group.enabled:
        return None
    return RemoteImageFetcher(
        group.allowlist,
        max_bytes=settings.videos.max_bytes,
        timeout_s=settings.videos.fetch_timeout_s,
        max_redirects=group.max_redirects,
        what=VIDEOS,
    )


async def _label_to_job(jobs: JobService, decisions: DecisionLog, done: LabelledItem) -> None:
    """A label into the decision log (never raises: a failed append is retried in the background), then,
    for a frame of an async job, the person's decision beside the model's in the job (and its webhook)."""
    await decisions.append([review_label_row(done)])
    item, label = done.item, done.label
    if item.job_id is None:
        return
    await jobs.add_review(item.job_id, JobReview(
        request_id=item.request_id, action=label.action, categories=list(label.categories),
        model_action=item.action, model_categories=list(item.categories), agrees=done.agrees,
        labelled_at=label.labelled_at,
    ))


def _second_engine(settings: Settings, state: aioredis.Redis | None) -> SecondEngine | None:
    """The shadow pairs' second engine (``MODGATE_SHADOW__ENGINE_URL``): its own pool, cap and model."""
    shadow = settings.shadow
    if shadow.engine_url is None:
        return None
    engine = settings.engine.model_copy(update={"max_inflight": shadow.max_inflight, "caps": None})
    own = settings.model_copy(update={"engine": engine})
    pool = build_engine_pool(own, [shadow.engine_url], state=state)
    identity = EngineIdentity(settings.engine.model_copy(update={"model": "auto"}), pool)

    async def model() -> str:
        return (await identity.current()).id

    return SecondEngine(pool, shadow.engine_kind, model, identity.model_ids)


def redis_client(url: str) -> aioredis.Redis:
    """The service's one Redis client, shared by every store: the policy, engine leases, API keys, tenants and
    quotas, jobs, reused verdicts, shadow records and the console's sign-ins and sessions.

    Short socket timeouts, so a dead Redis fails a call fast, and no retries: a command that timed out may
    have run (a lease taken, a flip applied), and only its store knows whether running it again is safe.
    The policy store and the engine leases must answer sooner still: they put a deadline on each call.
    """
    return open_redis(  # a plain server, or the primary behind Sentinel (gateway/state.py)
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=2.0, health_check_interval=10,
        retry=Retry(NoBackoff(), 0),
    )


@asynccontextmanager
async def open_services(
    settings: Settings,
    keys: KeyRing,
    engine_transport: httpx.AsyncBaseTransport | None = None,
    *,
    clock: Clock = time.monotonic,
    drain: Drain | None = None,
) -> AsyncIterator[Services]:
    """Build every client the handlers need; close them all on the way out (``clock``: the stats windows').

    The engine is given, never started here: ``settings.engine.url``, or ``engine_transport`` in tests. The
    command line (``modgate serve``) starts the built-in simulator and passes its URL when none is set.
    """
    if engine_transport is not None:
        engine_urls = ["http://engine.test"]
    elif settings.engine.url:
        engine_urls = settings.engine_urls()
    else:
        raise MissingEngine(
            "no engine to call: set MODGATE_ENGINE__URL (`modgate serve` starts the built-in simulated "
            "engine when it is unset)"
        )
    # Every resource is registered on the stack as soon as it exists: a failure half-way closes what was
    # opened. They close in the reverse order: jobs, shadow pairs, records, remote images, the engine
    # scraper, the policy store, the engines (and their leases), the executor, the tenant directory, Redis
    # (after every store that uses it), and telemetry last (it flushes).
    async with AsyncExitStack() as stack:
        telemetry = build_telemetry(settings.telemetry)
        stack.push_async_callback(asyncio.to_thread, telemetry.shutdown)  # flushes to the OTLP endpoint
        state = None if not settings.redis.url else redis_client(settings.redis.url)  # every store's client
        if state is not None:
            stack.push_async_callback(state.aclose)
            if settings.auth.api_keys_from_redis:
                keys.store = RedisKeyStore(state)
        # Tenants: named by the keys; weights and quotas from the settings and Redis (docs/tenants.md).
        directory = TenantDirectory(
            settings.tenants,
            set(settings.tenant_keys().values()) or ({ANONYMOUS_TENANT} if keys.open else set()),
            state,
            read_key_store=settings.auth.api_keys_from_redis,
        )
        await directory.reload()  # the Redis-held weights and quotas before the first request
        stack.push_async_callback(directory.stop)
        # A queue per tenant in front of the shaping threads: a flood's frames do not hold back a quiet one's.
        executor = ShapingPool(
            os.cpu_count() or 2, fairness=settings.admission.fairness, weight=directory.weight
        )
        stack.callback(executor.shutdown, wait=False, cancel_futures=True)
        engine_url = engine_urls[0]
        # One engine or several: a client, breaker and cap each, behind one queue (gateway/engine/pool.py).
        engines = build_engine_pool(
            settings, engine_urls, engine_transport, weight=directory.weight, state=state
        )
        stack.push_async_callback(engines.aclose)  # every engine's connections, and this replica's leases
        engine, admission = engines.engines[0].client, engines.queue
        policies = policy_store(settings, state)
        stack.push_async_callback(policies.stop)
        metrics = GatewayMetrics()
        calls = CallFigures(metrics)  # the engine calls' figures beyond their count (gateway/engine/calls.py)
        for slot in engines.engines:
            slot.client.count_calls(metrics.engine_call)
        recent = RecentRequests(settings.telemetry.window_s, clock=clock)
        engine_cache = EngineCacheScraper(
            engine.metrics_text,
            EngineCacheWindow(settings.telemetry.window_s, clock=clock),
            interval_s=settings.telemetry.engine_scrape_interval_s,
            on_error=calls.scrape_failed,
        )
        stack.push_async_callback(engine_cache.stop)
        remote_images = _remote_images(settings)
        if remote_images is not None:
            stack.push_async_callback(remote_images.aclose)
        metrics.watch_window(lambda: window_reading(recent, engine_cache.window,
                                                    policies.current().default_mode == "on"))
        register_pool_metrics(engines, metrics)
        quotas = TenantQuotas(directory, MemoryKeyframeRate() if state is None else RedisKeyframeRate(state))
        tenants = TenantFigures(admission, quotas, recent, executor)
        metrics.watch_tenants(tenants.readings)
        # The prefix strategy (shaping/prefix_strategy.py): chosen on the first engine before the system
        # prompt (block filling changes it), on every engine at start, and again after a restart.
        prefix = PrefixKeeper(
            prefix_strategy_setting(settings),
            [slot.client for slot in engines.engines],
            metrics,
            fill_max_tokens=settings.shaping.prefix_fill_max_tokens,
            reprime_interval_s=settings.shaping.prefix_reprime_interval_s,
            block_size=settings.shaping.prefix_block_size,
            hold=engines.slot_on,  # the gateway's own calls take a slot of the engine's cap, as keyframes do
        )
        stack.push_async_callback(prefix.stop)
        plain_prompts = {f: load_system_prompt(prompt_version_for(f)) for f in VERDICT_FORMATS}
        first = await prefix.decide(engine_url, plain_prompts)
        if prefix_strategy_setting(settings) == "block-fill" and first.action != "fill":
            log.error("block-filling prefix OFF: %s; serving the plain system prompt", first.reason)
        moderation = ModerationService(
            settings=settings,
            engine=engine,
            admission=admission,
            policies=policies,
            metrics=metrics,
            system_prompts={
                verdict_format: await system_prompt(
                    settings, engine, verdict_format, metrics, first.action == "fill"
                )
                for verdict_format in VERDICT_FORMATS
            },
            executor=executor,
            tracer=telemetry.tracer,
            recorder=RequestRecorder(metrics, recent, telemetry.instruments),
            remote_images=remote_images,
            verdicts=verdict_cache(settings, state),
            engines=engines,
        )
        records = quality_records(settings, state)
        stack.push_async_callback(records.aclose)
        second = _second_engine(settings, state)
        if second is not None:
            stack.push_async_callback(second.engines.aclose)
            for slot in second.engines.engines:
                slot.client.count_calls(metrics.engine_call)
            second.engines.start()
        moderation.review = review_queue(settings, state, metrics)
        moderation.shadow = ShadowSampler(
            engines=engines,
            store=records,
            system_prompts=moderation.system_prompts,
            user_text=settings.shaping.user_text,
            model=moderation.engine_model,
            model_ids=moderation.identity.model_ids,
            use_priority=settings.engine.use_priority,
            constraint=settings.engine.verdict_constraint,
            top_logprobs=settings.engine.top_logprobs,
            counters=VerdictRecorder(metrics),
            second=second,
        )
        stack.push_async_callback(moderation.shadow.drain, timeout_s=10.0)
        metrics.admission_limit(admission.queue_size)
        metrics.watch_policy(
            lambda: moderation.load.shedding, lambda: policies.current().shadow_share,
            lambda mode: policies.current().default_mode == mode, MODES,
        )
        unlogged = metrics.not_logged
        moderation.decisions = decision_log(settings, state, unlogged)
        if isinstance(moderation.decisions, RedisDecisionLog):  # rows still being retried: 5 s, then counted
            stack.push_async_callback(moderation.decisions.close, 5.0)
        archiver = DecisionArchiver(moderation.decisions, settings.decisions.archive_interval_s)
        stack.push_async_callback(archiver.stop)
        drain = drain or Drain(settings.server.drain_s)
        video_threads = ThreadPoolExecutor(settings.videos.cut_workers, thread_name_prefix="video-cut")
        stack.callback(video_threads.shutdown, wait=False, cancel_futures=True)
        video_fetcher = _video_fetcher(settings)
        if video_fetcher is not None:
            stack.push_async_callback(video_fetcher.aclose)
        video_probes = ThreadPoolExecutor(settings.videos.probe_workers, thread_name_prefix="video-probe")
        stack.callback(video_probes.shutdown, wait=False, cancel_futures=True)
        videos = VideoJobs(
            settings.videos, settings.jobs, video_threads, video_fetcher, video_probes,
            near_duplicates(settings),
        )
        jobs = job_service(settings, state, moderation, executor, remote_images, drain, videos)
        stack.push_async_callback(jobs.stop)
        moderation.review.on_label = partial(_label_to_job, jobs, moderation.decisions)
        await policies.start()  # never fails on a dead Redis: it serves the last known policy and says so
        engines.start()
        await engines.detect_engines()  # each engine's kind and slots (llama.cpp: its --parallel)
        await moderation.judge.tokens.images_countable()  # says at start which engines cannot be predicted
        # The first request each engine gets is the first-request probe's: a hybrid engine in float32
        # answers it 500 and exits, and the probe is what says so (gateway/engine/first_request.py).
        first_request = FirstRequestProbe(hold=engines.slot_on)
        await first_request.check_all([slot.client for slot in engines.engines])
        prefix.passed_first_request = partial(first_request.passed, engines)
        engine_checks = EngineChecks(
            [(slot.client, slot.cap) for slot in engines.engines],
            CheckTargets(settings.engine.model, settings.engine.top_logprobs),
            record=lambda check: calls.checked(check.check, check.engine, check.ok),
            hold=engines.slot_on,
            first_request=first_request,
        )
        stack.push_async_callback(engine_checks.aclose)
        if settings.engine.startup_check:
            engine_checks.start()
        await prefix.start(moderation.system_prompts)  # every engine's strategy; the priming it needs
        prefix.start_watching(settings.engine.model_recheck_s or 5.0)  # again after a restart or swap
        moderation.judge.prefix_observer = prefix.observe
        directory.start()
        engine_cache.start()
        jobs.start()
        if (missing := archive_missing()) is None:
            archiver.start()
        else:  # the runtime without the archive extra: rows stay on the stream (or in memory) until it is
            log.warning("decisions are not moved to Parquet files: %s", missing)
        oidc = None
        if settings.oidc.issuer is not None:  # the provider is first asked at the first sign-in, not here
            oidc = OidcSignIn(settings.oidc, await stack.enter_async_context(httpx.AsyncClient()))
        yield Services(
            settings,
            keys,
            engine,
            admission,
            policies,
            metrics,
            moderation,
            telemetry=telemetry,
            recent=recent,
            engine_cache=engine_cache,
            jobs=jobs,
            engines=engines,
            quotas=quotas,
            tenants=tenants,
            console=build_console_guard(
                SignInLimits(
                    per_client=settings.console.sign_in_max_failures_per_client,
                    everyone=settings.console.sign_in_max_failures,
                    window_s=settings.console.sign_in_window_s,
                ),
                state,
            ),
            review=moderation.review,
            drain=drain,
            engine_checks=engine_checks,
            prefix=prefix,
            first_request=first_request,
            oidc=oidc,
            question_log=question_log(settings, state, unlogged),
        )
