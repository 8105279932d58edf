"""Recent figures that cannot mislead: a time window of per-keyframe samples, and the engine's prefix-cache
counters differenced between scrapes.

The engine's own "prefix cache hit rate" (its log line, or ``hits_total / queries_total`` read once) is
cumulative since the engine started: a burst of identical probes at start keeps it looking healthy for hours
while production requests, whose shared prefix cannot fill a KV block, get nothing (docs/spark.md). So every
rate here covers a window of recent time: the gateway's own ``cached_tokens / prompt_tokens``, and the
increase of ``vllm:prefix_cache_hits_total`` over the increase of ``vllm:prefix_cache_queries_total``.
Both windows take their clock as an argument, so tests move time instead of sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.wires import DEFAULT_KIND, IMAGE_TOKENS_UNCOUNTED, WIRES, wire_for
from gateway.series.scraped import WindowReading
from gateway.tasks import stop
from shaping.verdict import ACTIONS

log = logging.getLogger("modgate.stats")

Clock = Callable[[], float]

LATENCIES = ("end_to_end", "ttft", "queue_wait", "shaping", "decode")
"""The per-keyframe latencies, in the order tables show them."""



@dataclass(frozen=True, slots=True)
class RequestSample:
    """One moderated keyframe: its timings in seconds and its token counts."""

    request_id: str  # the id the caller got (``modr-…``)
    action: str
    thinking: str
    reused: str | None  # "exact" / "near" when the verdict came from the cache (no engine call)
    end_to_end_s: float
    queue_wait_s: float
    shaping_s: float
    ttft_s: float | None  # None: no engine call, or the engine sent no token
    decode_s: float | None  # total engine time after the first token
    prompt_tokens: int
    cached_tokens: int
    image_tokens: int | None  # None: the engine counts none (llama.cpp)
    completion_tokens: int
    reasoning_tokens: int
    tenant: str = "default"  # as the caller's API key names it (never taken from the request)
    thinking_mode: str | None = None  # what the policy chose: ``escalate`` answers ``on`` or ``off``
    escalated: bool = False  # asked again with thinking on
    escalation_skipped: str | None = None  # unsure, but the cap kept it fast

    def latency(self, name: str) -> float | None:
        """One of :data:`LATENCIES`, in seconds (None where it does not apply: reused ones never queued)."""
        return {
            "end_to_end": self.end_to_end_s,
            "ttft": self.ttft_s,
            "queue_wait": self.queue_wait_s if self.reused is None else None,
            "shaping": self.shaping_s,
            "decode": self.decode_s,
        }[name]


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50 / p95 / p99 of one latency over the window, in seconds (None when no sample has it)."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None


def percentile(ordered: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of sorted values, interpolated linearly between ranks."""
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles(values: Iterable[float | None]) -> Percentiles:
    """p50 / p95 / p99 of the values that are present."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return Percentiles(0, None, None, None)
    p50, p95, p99 = (percentile(ordered, q) for q in (50, 95, 99))
    return Percentiles(len(ordered), p50, p95, p99)


def _known_sum(counts: Iterable[int | None]) -> int | None:
    """The sum, or None when a count is unknown (a part of the sum would be missing, not 0)."""
    total = 0
    for count in counts:
        if count is None:
            return None
        total += count
    return total


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """What the gateway's live requests looked like over the recent window (a job's are not in it)."""

    window_s: float
    covered_s: float  # the window, or less while the gateway has not run that long
    keyframes: int
    keyframes_per_minute: float
    thinking_share: float | None  # of keyframes judged by the engine with thinking on
    reused_share: float | None
    latencies: dict[str, Percentiles]
    prompt_tokens: int
    cached_tokens: int
    image_tokens: int | None  # None: an engine call of the window came from an engine that counts none
    completion_tokens: int
    reasoning_tokens: int
    escalation_share: float | None = None  # escalated / engine-judged escalate-mode keyframes
    escalations: int = 0
    escalations_skipped: int = 0
    actions: dict[str, int] = field(default_factory=dict)  # keyframes per action answered (after the policy)

    @property
    def cached_share(self) -> float | None:
        """Cached / prompt tokens of the window's engine calls: the prefix-cache rate production gets."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


class RecentRequests:
    """A ring of per-keyframe samples, trimmed to the last ``window_s`` seconds on every read and write."""

    def __init__(self, window_s: float, clock: Clock = time.monotonic, max_samples: int = 200_000) -> None:
        self.window_s = window_s
        self.clock = clock
        self.started = clock()
        self._samples: deque[tuple[float, RequestSample]] = deque(maxlen=max_samples)

    def add(self, sample: RequestSample) -> None:
        """Record one keyframe now."""
        now = self.clock()
        self._samples.append((now, sample))
        self._trim(now)

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def samples(self) -> list[RequestSample]:
        """The samples inside the window, oldest first."""
        self._trim(self.clock())
        return [sample for _, sample in self._samples]

    def summary(self) -> WindowSummary:
        """Percentiles, throughput, thinking share and token sums over the window."""
        return self.summary_of(self.samples())

    def by_tenant(self) -> dict[str, WindowSummary]:
        """:meth:`summary` for each tenant with keyframes in the window (one pass over the samples)."""
        grouped: dict[str, list[RequestSample]] = {}
        for sample in self.samples():
            grouped.setdefault(sample.tenant, []).append(sample)
        return {tenant: self.summary_of(samples) for tenant, samples in grouped.items()}

    def summary_of(self, samples: list[RequestSample]) -> WindowSummary:
        """The window's figures for these samples (an empty list: a tenant with nothing in the window)."""
        covered = max(1e-9, min(self.window_s, self.clock() - self.started))
        judged = [s for s in samples if s.reused is None]
        escalating = [s for s in judged if s.thinking_mode == "escalate"]
        escalations = sum(s.escalated for s in escalating)
        return WindowSummary(
            window_s=self.window_s,
            covered_s=covered,
            keyframes=len(samples),
            keyframes_per_minute=len(samples) * 60.0 / covered,
            thinking_share=sum(s.thinking == "on" for s in judged) / len(judged) if judged else None,
            reused_share=(len(samples) - len(judged)) / len(samples) if samples else None,
            latencies={name: percentiles(s.latency(name) for s in samples) for name in LATENCIES},
            prompt_tokens=sum(s.prompt_tokens for s in judged),
            cached_tokens=sum(s.cached_tokens for s in judged),
            image_tokens=_known_sum(s.image_tokens for s in judged),
            completion_tokens=sum(s.completion_tokens for s in judged),
            reasoning_tokens=sum(s.reasoning_tokens for s in judged),
            escalation_share=escalations / len(escalating) if escalating else None,
            escalations=escalations,
            escalations_skipped=sum(s.escalation_skipped is not None for s in escalating),
            actions={action: sum(s.action == action for s in samples) for action in ACTIONS},
        )


@dataclass(frozen=True, slots=True)
class EngineCacheCounters:
    """The engine's prefix-cache counters (tokens, totals since it started) and its KV block size."""

    queries: float
    hits: float
    block_size: int | None  # from the engine's cache configuration where it shows one (its wire reads it)
    kind: str = DEFAULT_KIND  # whose counter names the text carries (a label: the wire says what it means)

    @property
    def since_start_ratio(self) -> float | None:
        """hits / queries since the engine started: the figure that misleads (kept for the contrast only)."""
        return self.hits / self.queries if self.queries else None


def read_engine_cache_counters(text: str) -> EngineCacheCounters:
    """Read the prefix-cache counters and block size from the engine's Prometheus text.

    Sums over label sets (one per engine in a data-parallel server). llama.cpp's server counts the prompt
    tokens it processed and those it reused: looked up = both, found = reused. Raises ValueError when the
    engine exposes no prefix-cache counter (prefix caching off, ``--metrics`` not given, another server).
    """
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    config = next((said for wire in WIRES.values() if (said := wire.cache_config(samples))), None)
    block_size = None if config is None else config.block_size
    # Each engine kind names its counters (gateway/engine/wires/): the names in the text say which it is.
    counted = next(
        ((wire.kind, found) for wire in WIRES.values() if (found := wire.cache_counters(samples))), None
    )
    if counted is None:
        raise ValueError(
            "the engine's /metrics has no prefix-cache counters (vllm:prefix_cache_queries_total / "
            "hits_total, or llama.cpp's llamacpp:prompt_tokens_total / prompt_tokens_cached_total)"
        )
    kind, (queries, hits) = counted
    return EngineCacheCounters(queries=queries, hits=hits, block_size=block_size, kind=kind)


@dataclass(frozen=True, slots=True)
class CacheRate:
    """Prefix-cache tokens hit over tokens queried between two scrapes of the engine."""

    hits: float
    queries: float
    span_s: float  # time between the two scrapes the increase is taken over
    scrapes: int

    @property
    def ratio(self) -> float | None:
        """hits / queries over the span; None when nothing was queried (no traffic is not a 0 % hit rate)."""
        return self.hits / self.queries if self.queries > 0 else None


def _increase(points: list[tuple[float, EngineCacheCounters]]) -> tuple[float, float]:
    """Sum of per-interval increases; a counter that went down means the engine restarted from zero."""
    hits = queries = 0.0
    for (_, before), (_, after) in itertools.pairwise(points):
        restarted = after.queries < before.queries or after.hits < before.hits
        queries += after.queries if restarted else after.queries - before.queries
        hits += after.hits if restarted else after.hits - before.hits
    return hits, queries


class EngineCacheWindow:
    """Scrapes of the engine's counters over the last ``window_s`` seconds.

    The increase over the window is taken from the newest scrape at or before the window's start (so a
    window always has a base when scrapes are frequent enough) to the latest scrape.
    """

    def __init__(self, window_s: float, clock: Clock = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._points: deque[tuple[float, EngineCacheCounters]] = deque()
        self.block_size: int | None = None
        self.kind: str | None = None  # None before the first scrape

    def observe(self, counters: EngineCacheCounters) -> None:
        """One scrape, now."""
        now = self.clock()
        self._points.append((now, counters))
        if counters.block_size is not None:
            self.block_size = counters.block_size
        self.kind = counters.kind
        self._trim(now)

    def _trim(self, now: float) -> None:
        # Keep one point at or before the window's start: the base of the increase.
        horizon = now - self.window_s
        while len(self._points) > 1 and self._points[1][0] <= horizon:
            self._points.popleft()

    @property
    def latest(self) -> EngineCacheCounters | None:
        """The last scrape's counters."""
        return self._points[-1][1] if self._points else None

    def window_rate(self) -> CacheRate:
        """The increase of hits over the increase of queries across the window."""
        self._trim(self.clock())
        points = list(self._points)
        hits, queries = _increase(points)
        span = points[-1][0] - points[0][0] if len(points) > 1 else 0.0
        return CacheRate(hits=hits, queries=queries, span_s=span, scrapes=len(points))

    def last_interval_rate(self) -> CacheRate:
        """The increase between the last two scrapes only."""
        points = list(self._points)[-2:]
        hits, queries = _increase(points)
        span = points[-1][0] - points[0][0] if len(points) > 1 else 0.0
        return CacheRate(hits=hits, queries=queries, span_s=span, scrapes=len(points))


class EngineCacheScraper:
    """Reads the engine's ``/metrics`` every ``interval_s`` seconds into an :class:`EngineCacheWindow`.

    A failed read is counted and logged, never raised: the engine's metrics are advice, not the service.
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[str]],
        window: EngineCacheWindow,
        interval_s: float,
        timeout_s: float = 5.0,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.fetch = fetch
        self.window = window
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def scrape_once(self) -> EngineCacheCounters | None:
        """Read the counters now; None (and the reason in ``last_error``) when they cannot be read."""
        try:
            async with asyncio.timeout(self.timeout_s):
                text = await self.fetch()
            counters = read_engine_cache_counters(text)
        except Exception as exc:  # any failure of an advisory read is logged, never raised
            self.failures += 1
            reason = f"{type(exc).__name__}: {exc}"
            if reason != self.last_error:  # log each new reason once, not every interval
                log.warning("cannot read the engine's prefix-cache counters: %s", reason)
            self.last_error = reason
            if self.on_error is not None:
                self.on_error(type(exc).__name__)
            return None
        self.last_error = None
        self.scrapes += 1
        self.window.observe(counters)
        return counters

    def start(self) -> None:
        """Scrape now and then every ``interval_s`` seconds in a background task (0: never)."""
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="engine-metrics-scrape")

    async def _run(self) -> None:
        while True:
            await self.scrape_once()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        """Cancel the background task."""
        if self._task is None:
            return
        await stop(self._task)
        self._task = None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _latency_ms(summary: WindowSummary, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: {"count": p.count, "p50": _ms(p.p50), "p95": _ms(p.p95), "p99": _ms(p.p99)}
        for name, p in summary.latencies.items() if name in names
    }


def _share(summary: WindowSummary, action: str) -> float | None:
    """The window's keyframes answered ``action``, as a share (null: none answered)."""
    return _ratio(summary.actions.get(action, 0) / summary.keyframes if summary.keyframes else None)


def tenant_document(summary: WindowSummary) -> dict[str, Any]:
    """One tenant's part of ``GET /stats``: throughput, thinking share, latency and queue wait."""
    return {
        "keyframes": summary.keyframes,
        "keyframes_per_minute": round(summary.keyframes_per_minute, 3),
        "thinking_share": _ratio(summary.thinking_share),
        "reused_share": _ratio(summary.reused_share),
        "latency_ms": _latency_ms(summary, ("end_to_end", "queue_wait", "ttft")),
        "tokens": {"prompt": summary.prompt_tokens, "completion": summary.completion_tokens},
        # the verdicts the tenant got (after its moderation policy): what its operators watch
        "actions": dict(summary.actions),
        "block_share": _share(summary, "block"),
        "review_share": _share(summary, "review"),
    }


def stats_document(recent: RecentRequests, engine_cache: EngineCacheScraper) -> dict[str, Any]:
    """``GET /stats``: the recent window's percentiles, throughput, thinking share and cache rates.

    Ratios are null when there was nothing to measure (no engine call, no engine query): "no traffic" must
    not read as "0 % hit rate". The engine's since-start ratio is absent on purpose.
    """
    summary = recent.summary()
    window = engine_cache.window
    engine_rate = window.window_rate()
    return {
        "window_s": summary.window_s,
        "covered_s": round(summary.covered_s, 3),
        "keyframes": summary.keyframes,
        "keyframes_per_minute": round(summary.keyframes_per_minute, 3),
        "thinking_share": _ratio(summary.thinking_share),
        "reused_share": _ratio(summary.reused_share),
        "escalation": {
            "share": _ratio(summary.escalation_share),
            "escalated": summary.escalations,
            "skipped_by_cap": summary.escalations_skipped,
        },
        "latency_ms": _latency_ms(summary, LATENCIES),
        "tokens": {
            "prompt": summary.prompt_tokens,
            "cached": summary.cached_tokens,
            "image": summary.image_tokens,
            "image_reason": None if summary.image_tokens is not None else IMAGE_TOKENS_UNCOUNTED,
            "completion": summary.completion_tokens,
            "reasoning": summary.reasoning_tokens,
        },
        "cache": {
            "gateway_cached_share": _ratio(summary.cached_share),
            "engine_window_hit_rate": _ratio(engine_rate.ratio),
            "engine_window_hits": engine_rate.hits,
            "engine_window_queries": engine_rate.queries,
            "engine_window_span_s": round(engine_rate.span_s, 3),
            "engine_scrapes_in_window": engine_rate.scrapes,
            "engine_block_size": window.block_size,
            "engine_kind": window.kind,  # a label; what it means for the block is the next field
            # what stands for the block where the engine has none (it reuses token by token), or None
            "engine_block_note": None if window.kind is None else wire_for(window.kind).block_note,
            "engine_scrape_error": engine_cache.last_error,
        },
    }


def window_reading(
    recent: RecentRequests, engine_cache: EngineCacheWindow, thinking_default_on: bool
) -> WindowReading:
    """The window's figures now, for the ``modgate_window_*`` gauges (gateway/series/scraped.py)."""
    summary = recent.summary()
    engine = engine_cache.window_rate()
    return WindowReading(
        window_s=summary.window_s,
        prompt_cached_ratio=summary.cached_share,
        engine_hit_ratio=engine.ratio,
        engine_queried_tokens=engine.queries,
        keyframes_per_minute=summary.keyframes_per_minute,
        thinking_share=summary.thinking_share,
        escalation_share=summary.escalation_share,
        thinking_default_on=thinking_default_on,
        kv_block_size=engine_cache.block_size,
    )
