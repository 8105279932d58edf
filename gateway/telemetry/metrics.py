"""Gateway metrics in Prometheus form (``GET /metrics``); gateway/telemetry/recorder.py writes a request's.

Rates of the engine's prefix cache are exposed only over a recent window (gateway/telemetry/windows.py): the
since-start ratio of the engine's counters is the number that misleads, so it is not a metric here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.telemetry.windows import EngineCacheWindow, RecentRequests

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
            "modgate_requests", "Requests by route (moderations, decisions, ...) and outcome.",
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
        # it as a miss however fast it failed (deploy/monitoring/modgate-rules.yaml).
        self.e2e = Histogram(
            "modgate_request_seconds", "End-to-end latency per keyframe, by outcome (ok, or how it failed).",
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
            "modgate_tenant_request_seconds", "End-to-end latency per keyframe, by tenant.", ["tenant"],
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.tenant_queue_wait = Histogram(
            "modgate_tenant_queue_wait_seconds", "Engine slot wait per engine-judged keyframe, by tenant.",
            ["tenant"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.tenant_frames = Counter(
            "modgate_tenant_frames",
            "Keyframes answered, by tenant and thinking mode (reused: from the verdict cache).",
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
        # Video jobs (gateway/jobs/video.py): what an operator watches of the cut and its coverage.
        self.video_jobs = Counter(
            "modgate_video_jobs", "Video jobs finished, by status and code (ok when they succeeded).",
            ["status", "code"], registry=registry,
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

    def video_cut(
        self, seconds: float, decoded: int, covered: int, sent: int, reused: int, gap_ms: int
    ) -> None:
        """One video cut, told by the video jobs."""
        self.video_cut_seconds.observe(seconds)
        for stage, count in (("decoded", decoded), ("covered", covered), ("sent", sent), ("reused", reused)):
            self.video_frames.labels(stage).inc(count)
        self.video_coverage_gap.observe(gap_ms / 1000)

    def engine_call(self, engine: str, purpose: str, outcome: str, seconds: float) -> None:
        """One engine request, reported by its client (``EngineClient.count_calls``)."""
        self.engine_calls.labels(engine, purpose, outcome).inc()
        if outcome != "circuit_open":
            self.engine_call_seconds.labels(engine, purpose).observe(seconds)

    def shadow(self, outcome: str) -> None:
        """Count one shadow judgement's outcome."""
        self.shadow_pairs.labels(outcome).inc()

    def watch_tenants(self, source: Callable[[], Iterator[Metric]]) -> None:
        """Expose per-tenant figures read at scrape time (admission, quotas, the recent window)."""
        self.registry.register(_Scraped(source))

    def watch(
        self, recent: RecentRequests, engine_cache: EngineCacheWindow, thinking_default_on: Callable[[], bool]
    ) -> None:
        """Expose the recent window's figures as gauges, computed at scrape time."""
        self.registry.register(_WindowCollector(recent, engine_cache, thinking_default_on))


def _gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    # NaN, not 0, when there is nothing to measure: "no traffic" must not read as "0 % hit rate".
    return GaugeMetricFamily(name, documentation, value=math.nan if value is None else value)


class _WindowCollector(Collector):
    """Windowed gauges: cache efficiency, throughput and thinking share over the last ``window_s`` seconds."""

    def __init__(
        self, recent: RecentRequests, engine_cache: EngineCacheWindow, thinking_default_on: Callable[[], bool]
    ) -> None:
        self.recent = recent
        self.engine_cache = engine_cache
        self.thinking_default_on = thinking_default_on

    def collect(self) -> Iterator[Metric]:
        """Read the windows now."""
        summary = self.recent.summary()
        engine = self.engine_cache.window_rate()
        yield _gauge(
            "modgate_window_seconds",
            "Length of the window the modgate_window_* gauges cover.",
            summary.window_s,
        )
        yield _gauge(
            "modgate_window_prompt_cached_ratio",
            "Cached / prompt tokens of the gateway's own engine calls over the window (NaN: no calls).",
            summary.cached_share,
        )
        yield _gauge(
            "modgate_window_engine_prefix_cache_hit_ratio",
            "Increase of vllm:prefix_cache_hits_total over the increase of vllm:prefix_cache_queries_total "
            "between scrapes of the engine across the window (NaN: nothing queried). Never since start.",
            engine.ratio,
        )
        yield _gauge(
            "modgate_window_engine_prefix_cache_queries_tokens",
            "Prompt tokens the engine looked up in its prefix cache over the window.",
            engine.queries,
        )
        yield _gauge(
            "modgate_window_keyframes_per_minute",
            "Keyframes answered per minute over the window.",
            summary.keyframes_per_minute,
        )
        yield _gauge(
            "modgate_window_thinking_share",
            "Share of engine-judged keyframes with thinking on over the window (NaN: none).",
            summary.thinking_share,
        )
        yield _gauge(
            "modgate_window_escalation_share",
            "Share of engine-judged escalate-mode keyframes asked again with thinking on (NaN: none).",
            summary.escalation_share,
        )
        yield _gauge(
            "modgate_thinking_default_on",
            "1 when the thinking policy's default mode is on, else 0.",
            1.0 if self.thinking_default_on() else 0.0,
        )
        if self.engine_cache.block_size is not None:
            yield _gauge(
                "modgate_engine_kv_block_size_tokens",
                "The engine's KV block size (vllm:cache_config_info): shorter prefixes never hit.",
                self.engine_cache.block_size,
            )


class _Scraped(Collector):
    """Metrics computed by a function at scrape time."""

    def __init__(self, source: Callable[[], Iterator[Metric]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        """Read the source now."""
        yield from self.source()
