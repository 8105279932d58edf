"""The gateway's registry and its request, engine, policy and job series (``GET /metrics``).

Rates of the engine's prefix cache are exposed only over a recent window (gateway/series/scraped.py): the
since-start ratio of the engine's counters is the number that misleads, so it is not a metric here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.series.scraped import (
    PoolReading,
    Scraped,
    TenantReading,
    WindowReading,
    pool_series,
    tenant_series,
    window_series,
)

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    30.0,
    60.0,
)


class GatewayMetrics:
    """The gateway's own metrics, in a registry of its own (one per app, so tests do not share state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry

        def seconds(name: str, documentation: str) -> Histogram:
            return Histogram(name, documentation, buckets=LATENCY_BUCKETS, registry=registry)

        self.requests = Counter(
            "modgate_requests", "Live requests by route (moderations, decisions, ...) and outcome.",
            ["route", "outcome"], registry=registry
        )
        self.frames = Counter(
            "modgate_frames",
            "Keyframes moderated, by action and thinking mode.",
            ["action", "thinking"],
            registry=registry,
        )
        self.unparsable = Counter(
            "modgate_unparsable_outputs",
            "Engine outputs that could not be used as a verdict.",
            ["problem"],
            registry=registry,
        )
        self.reused = Counter(
            "modgate_reused_verdicts", "Verdicts reused from the cache.", ["kind"], registry=registry
        )
        self.engine_errors = Counter(
            "modgate_engine_errors", "Engine call failures.", ["kind"], registry=registry
        )
        # By outcome: a failed request is observed too (under its outcome), so the latency objective counts
        # it as a miss however fast it failed (deploy/monitoring/modgate-rules.yaml). Live requests only: a
        # job's keyframes wait behind them by design, and are counted under their job.
        self.e2e = Histogram(
            "modgate_request_seconds",
            "End-to-end latency per keyframe of a live request, by outcome (ok, or how it failed).",
            ["outcome"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.ttft = seconds("modgate_engine_ttft_seconds", "Engine time to first token.")
        self.queue_wait = seconds("modgate_queue_wait_seconds", "Wait for an engine slot.")
        self.shaping = seconds("modgate_shaping_seconds", "Image shaping per keyframe.")
        self.decode = seconds("modgate_engine_decode_seconds", "Engine time after the first token.")
        self.inflight = Gauge("modgate_engine_inflight", "Requests at the engine.", registry=registry)
        self.queued = Gauge("modgate_engine_queued", "Requests waiting for a slot.", registry=registry)
        self.prompt_tokens = Counter("modgate_prompt_tokens", "Prompt tokens sent.", registry=registry)
        self.cached_tokens = Counter(
            "modgate_cached_tokens", "Prompt tokens served from the prefix cache.", registry=registry
        )
        self.token_predictions = Counter(
            "modgate_token_predictions",
            "Requests whose predicted prompt tokens were compared with the engine's usage.",
            registry=registry,
        )
        self.token_mismatches = Counter(
            "modgate_token_prediction_mismatches",
            "Requests whose prompt tokens differed from the prediction.",
            registry=registry,
        )
        self.engine_scrape_errors = Counter(
            "modgate_engine_scrape_errors",
            "Failed reads of the engine's /metrics.",
            ["kind"],
            registry=registry,
        )

        # Per tenant: the label's values come from the API keys (a bounded set), never from a request.
        self.tenant_e2e = Histogram(
            "modgate_tenant_request_seconds", "End-to-end latency per live keyframe, by tenant.", ["tenant"],
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.tenant_queue_wait = Histogram(
            "modgate_tenant_queue_wait_seconds",
            "Engine slot wait per engine-judged live keyframe, by tenant.", ["tenant"],
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.tenant_frames = Counter(
            "modgate_tenant_frames",
            "Keyframes answered, live or for a job, by tenant and thinking mode (reused: from the verdict "
            "cache).",
            ["tenant", "thinking"],
            registry=registry,
        )
        self.shadow_pairs = Counter(
            "modgate_shadow_pairs",
            "Shadow judgements for the quality module, by outcome (recorded, skipped_busy, engine_error).",
            ["outcome"],
            registry=registry,
        )

        self.escalations = Counter(
            "modgate_escalations",
            "Fast verdicts asked again with thinking on, by why (review, low_confidence, no_confidence, "
            "category).",
            ["reason"],
            registry=registry,
        )
        self.escalations_skipped = Counter(
            "modgate_escalations_skipped",
            "Unsure fast verdicts answered fast anyway, by why (cap_share, cap_rate, reask_failed).",
            ["reason"],
            registry=registry,
        )

        # What the alert rules compare the counters above with (deploy/monitoring/, docs/alerts.md).
        self.output_token_weight = Gauge(
            "modgate_tenants_output_token_weight",
            "One output token's engine time in prompt tokens (the fair share's work weight): as set, or "
            "learned from the engine's calls.",
            registry=registry,
        )
        self.queue_size = Gauge(
            "modgate_engine_queue_size",
            "Requests the admission queue holds waiting for a slot before it answers 429.",
            registry=registry,
        )
        self.load_shedding = Gauge(
            "modgate_thinking_load_shedding",
            "1 while the policy's load rule holds thinking off on this replica (queue above its mark).",
            registry=registry,
        )
        self.default_mode = Gauge(
            "modgate_thinking_default_mode",
            "1 for the thinking policy's default mode (on, off or escalate), 0 for the others.",
            ["mode"],
            registry=registry,
        )
        self.shadow_share = Gauge(
            "modgate_policy_shadow_share",
            "The policy's shadow_share: the share of live frames re-judged in the other mode (0: none).",
            registry=registry,
        )
        self.cacheable_prefix = Gauge(
            "modgate_prefix_cacheable_tokens",
            "Prompt tokens every request should take from the engine's prefix cache: the whole KV blocks of "
            "the block-filled shared prefix (0: block filling off, or the engine could not be measured).",
            ["verdict_format"],
            registry=registry,
        )
        self.engine_check = Gauge(
            "modgate_engine_check",
            "What the start-up check found on each engine (gateway/engine/startup_check.py): 1 present, "
            "0 missing (the log and /readyz name the fix); absent when the engine does not say.",
            ["check", "engine"],
            registry=registry,
        )
        # Every request the gateway sends to an engine, through its EngineClient (gateway/engine/calls.py).
        self.engine_calls = Counter(
            "modgate_engine_calls",
            "Requests sent to each engine, by purpose (verdict, probe, primer, check, tokenize, props, "
            "metrics, health, models, decision) and outcome, settled when the answer ends or fails (ok: "
            "whole; busy, rejected, error, timeout, cancelled: the caller left; circuit_open: refused by the "
            "circuit breaker before sending).",
            ["engine", "purpose", "outcome"],
            registry=registry,
        )
        self.engine_call_seconds = Histogram(
            "modgate_engine_call_seconds",
            "Time of each engine request, from sending to the end of its answer (a streamed verdict: its "
            "last chunk).",
            ["engine", "purpose"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        # The prefix keeper's (gateway/engine/prefix_keeper.py): how each engine's prefix cache is kept.
        self.prefix_primings = Counter(
            "modgate_prefix_primings",
            "Priming requests sent to keep the engine's linear-attention state at the shared prefix, by why: "
            "start, cache_fell (a request got fewer cached tokens than the shared prefix: restart, swap, "
            "eviction), restart (the engine answered again after it could not be reached), swap (its cache "
            "config changed), failed (the priming request itself failed).",
            ["engine", "reason"],
            registry=registry,
        )
        self.prefix_strategy = Gauge(
            "modgate_prefix_strategy",
            "1 for the prefix strategy in force on each engine (prime, engine-checkpoint, fill, none, "
            "uncacheable).",
            ["engine", "strategy"],
            registry=registry,
        )
        self.prefix_uncacheable = Gauge(
            "modgate_prefix_uncacheable",
            "1 while the engine cannot cache the shared prefix (the log and /readyz name the engine flag).",
            ["engine"],
            registry=registry,
        )
        self.decisions_unlogged = Counter(
            "modgate_decisions_unlogged", "Decisions answered that the decision log did not take",
            registry=registry,
        )

        # Jobs (gateway/jobs/), written by the recorder: a job's requests are counted here, not as live ones.
        self.jobs = Counter(
            "modgate_jobs", "Jobs finished, by kind (keyframes, video) and final status (succeeded, failed).",
            ["kind", "status"], registry=registry,
        )
        self.job_failures = Counter(
            "modgate_job_failures", "Jobs that failed, by kind and the error's code.", ["kind", "code"],
            registry=registry,
        )
        self.job_requests = Counter(
            "modgate_job_requests",
            "Moderation requests made for jobs (a keyframes job's one per attempt, a video job's one per "
            "chunk of its frames), by kind and outcome: background work, outside modgate_requests_total.",
            ["kind", "outcome"], registry=registry,
        )
        self.video_cut_seconds = Histogram(
            "modgate_video_cut_seconds", "Time to cut one video (every frame decoded, shot changes).",
            buckets=(*LATENCY_BUCKETS, 90.0, 120.0, 300.0), registry=registry,
        )
        self.video_frames = Counter(
            "modgate_video_frames", "Video frames by stage: decoded, covered, sent to the engine (sent), and "
            "covered by a judged look-alike's verdict (reused).", ["stage"], registry=registry,
        )
        self.video_coverage_gap = Histogram(
            "modgate_video_coverage_gap_seconds",
            "Each cut video's largest gap: how long any decoded frame lies after the last covered frame.",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0), registry=registry,
        )

    def engine_call(self, engine: str, purpose: str, outcome: str, seconds: float) -> None:
        """One engine request, reported by its client (``EngineClient.count_calls``)."""
        self.engine_calls.labels(engine, purpose, outcome).inc()
        if outcome != "circuit_open":
            self.engine_call_seconds.labels(engine, purpose).observe(seconds)

    # --- what the rooms below telemetry count (the prefix keeper, the decision log) -------------------

    def prefix_strategy_chosen(self, engine: str, chosen: str, strategies: tuple[str, ...]) -> None:
        """The prefix keeper chose ``chosen`` on ``engine``: 1 for it, 0 for every other of ``strategies``."""
        for strategy in strategies:
            self.prefix_strategy.labels(engine, strategy).set(1.0 if strategy == chosen else 0.0)
        self.prefix_uncacheable.labels(engine).set(1.0 if chosen == "uncacheable" else 0.0)

    def prefix_primed(self, engine: str, reason: str) -> None:
        """One priming request on ``engine``, by why (``failed``: the request itself failed)."""
        self.prefix_primings.labels(engine, reason).inc()

    def not_logged(self, count: int = 1) -> None:
        """``count`` decisions (or a Decisions question) the decision log did not take."""
        self.decisions_unlogged.inc(count)

    # --- set at start, or read at scrape time ---------------------------------------------------------

    def prefix_cacheable(self, verdict_format: str, tokens: int) -> None:
        """The shared prefix's cacheable tokens for ``verdict_format``, as measured at start (0: none)."""
        self.cacheable_prefix.labels(verdict_format).set(tokens)

    def admission_limit(self, queue_size: int) -> None:
        """The admission queue's size, fixed at start."""
        self.queue_size.set(queue_size)

    def admission_now(self, inflight: int, queued: int) -> None:
        """The admission queue's figures, read at each scrape (``GET /metrics``)."""
        self.inflight.set(inflight)
        self.queued.set(queued)

    def watch_output_token_weight(self, read: Callable[[], float]) -> None:
        """Expose the fair share's output token weight, read at scrape time."""
        self.output_token_weight.set_function(read)

    def watch_policy(
        self, shedding: Callable[[], bool], shadow_share: Callable[[], float],
        default_mode: Callable[[str], bool], modes: tuple[str, ...],
    ) -> None:
        """Expose what the thinking policy holds now (load shedding, its shadow share, its default mode among
        ``modes``), read at scrape time."""
        self.load_shedding.set_function(lambda: 1.0 if shedding() else 0.0)
        self.shadow_share.set_function(shadow_share)
        for mode in modes:
            self.default_mode.labels(mode).set_function(partial(_one_if, default_mode, mode))

    def watch_pool(self, read: Callable[[], PoolReading]) -> None:
        """Expose the engine pool's figures (``modgate_engine_*{engine}``), read at scrape time."""
        self.registry.register(Scraped(lambda: pool_series(read())))

    def watch_tenants(self, read: Callable[[], list[TenantReading]]) -> None:
        """Expose per-tenant figures (admission, quotas, the recent window), read at scrape time."""
        self.registry.register(Scraped(lambda: tenant_series(read())))

    def watch_window(self, read: Callable[[], WindowReading]) -> None:
        """Expose the recent window's figures as gauges, read at scrape time."""
        self.registry.register(Scraped(lambda: window_series(read())))


def _one_if(holds: Callable[[str], bool], value: str) -> float:
    return 1.0 if holds(value) else 0.0
