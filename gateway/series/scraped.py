"""Series computed at each scrape from plain readings: the engine pool's, the tenants', the recent window's.

Their owners (gateway/engine/pool_build.py, gateway/http/tenant_figures.py, gateway/telemetry/windows.py)
read their state into the readings below; the names, help texts and labels are declared here, with every other
series. A figure with nothing to measure reads NaN, not 0: "no traffic" must not read as "0 % hit rate".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

QUOTAS = ("keyframes_per_minute", "max_concurrent")
"""The tenant quotas the ``quota`` label names."""


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One engine of the pool at a scrape."""

    url: str
    inflight: int  # calls this replica has at it
    cap: int  # its in-flight cap (across replicas with Redis)
    up: bool  # its circuit is closed
    failovers: int
    busy: int  # calls it answered busy


@dataclass(frozen=True, slots=True)
class SharedCapReading:
    """The engine caps shared through Redis leases at a scrape."""

    local_only: bool  # Redis is unreachable: the caps hold per replica only
    outside: int  # calls at the engines the shared cap does not count


@dataclass(frozen=True, slots=True)
class PoolReading:
    """The engine pool at a scrape (``shared`` None: no Redis leases)."""

    engines: tuple[EngineReading, ...]
    shared: SharedCapReading | None = None


@dataclass(frozen=True, slots=True)
class TenantReading:
    """One tenant at a scrape: its share of the engine, its quotas, its recent window."""

    tenant: str
    weight: float
    queued: int
    inflight: int
    work_served: float
    keyframes_per_minute: float
    thinking_share: float | None
    e2e_p95_s: float | None
    queue_wait_p95_s: float | None
    quotas: Mapping[str, int]  # each of QUOTAS: its limit (0: none)
    refused: Mapping[str, int]  # each of QUOTAS: requests refused over it


@dataclass(frozen=True, slots=True)
class WindowReading:
    """The recent window's figures at a scrape."""

    window_s: float
    prompt_cached_ratio: float | None
    engine_hit_ratio: float | None
    engine_queried_tokens: float
    keyframes_per_minute: float
    thinking_share: float | None
    escalation_share: float | None
    thinking_default_on: bool
    kv_block_size: int | None  # None: the engine does not say (its gauge is then left out)


def _value(value: float | None) -> float:
    return math.nan if value is None else value


def pool_series(pool: PoolReading) -> Iterator[Metric]:
    """``modgate_engine_*{engine}`` and, with Redis leases, the shared caps' gauges."""
    inflight = GaugeMetricFamily(
        "modgate_engine_slot_inflight", "Calls this replica has at each engine.", labels=["engine"]
    )
    cap = GaugeMetricFamily(
        "modgate_engine_slot_cap", "Each engine's in-flight cap (across replicas with Redis).",
        labels=["engine"],
    )
    up = GaugeMetricFamily(
        "modgate_engine_up",
        "1 while the engine's circuit is closed; 0 from a failure that opened it until a probe succeeds.",
        labels=["engine"],
    )
    failovers = CounterMetricFamily(
        "modgate_engine_failovers", "Calls moved to another engine because this one could not take them.",
        labels=["engine"],
    )
    busy = CounterMetricFamily(
        "modgate_engine_busy",
        "Calls the engine answered busy (its own queue full, no slot free): back-pressure, which waits "
        "in the gateway or moves to another engine and never opens the circuit.",
        labels=["engine"],
    )
    for engine in pool.engines:
        busy.add_metric([engine.url], engine.busy)
        inflight.add_metric([engine.url], engine.inflight)
        cap.add_metric([engine.url], engine.cap)
        up.add_metric([engine.url], 1.0 if engine.up else 0.0)
        failovers.add_metric([engine.url], engine.failovers)
    yield from (inflight, cap, up, failovers, busy)
    if pool.shared is not None:
        yield GaugeMetricFamily(
            "modgate_engine_leases_local_only",
            "1 while Redis is unreachable and engine caps hold per replica only.",
            value=1.0 if pool.shared.local_only else 0.0,
        )
        yield GaugeMetricFamily(
            "modgate_engine_calls_outside_shared_cap",
            "Calls this replica has at the engines that the shared cap does not count: admitted on its"
            " local caps while Redis was unreachable, or whose lease was lost (expired unrenewed, or"
            " not yet replicated when the primary failed); the engines may exceed their caps by these.",
            value=pool.shared.outside,
        )


def tenant_series(tenants: Iterable[TenantReading]) -> Iterator[Metric]:
    """``modgate_tenant_*`` gauges and counters (label ``tenant``; ``quota`` for the quotas)."""
    def gauge(name: str, documentation: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, labels=["tenant"])

    weight = gauge("modgate_tenant_weight", "The tenant's weight in the fair share of engine work.")
    queued = gauge("modgate_tenant_queued", "Engine calls of the tenant waiting for a slot.")
    inflight = gauge("modgate_tenant_inflight", "Engine calls of the tenant holding a slot.")
    work = CounterMetricFamily(
        "modgate_tenant_engine_work",
        "Engine work served, in prompt-token equivalents (prompt + weight x output tokens).",
        labels=["tenant"],
    )
    rate = gauge("modgate_tenant_window_keyframes_per_minute", "Keyframes a minute, recent window.")
    thinking = gauge("modgate_tenant_window_thinking_share",
                     "Engine-judged keyframes with thinking on, recent window (NaN: none).")
    e2e_p95 = gauge("modgate_tenant_window_e2e_p95_seconds", "End-to-end p95, recent window (NaN: none).")
    wait_p95 = gauge("modgate_tenant_window_queue_wait_p95_seconds",
                     "Wait for an engine slot, p95, recent window (NaN: none).")
    limit = GaugeMetricFamily("modgate_tenant_quota_limit", "The tenant's quota (0: none).",
                              labels=["tenant", "quota"])
    refused = CounterMetricFamily("modgate_tenant_quota_refusals",
                                  "Requests refused over a quota (429; 400 if larger than it).",
                                  labels=["tenant", "quota"])
    for tenant in tenants:
        name = tenant.tenant
        weight.add_metric([name], tenant.weight)
        queued.add_metric([name], tenant.queued)
        inflight.add_metric([name], tenant.inflight)
        work.add_metric([name], tenant.work_served)
        rate.add_metric([name], tenant.keyframes_per_minute)
        thinking.add_metric([name], _value(tenant.thinking_share))
        e2e_p95.add_metric([name], _value(tenant.e2e_p95_s))
        wait_p95.add_metric([name], _value(tenant.queue_wait_p95_s))
        for quota in QUOTAS:
            limit.add_metric([name, quota], tenant.quotas.get(quota, 0))
            refused.add_metric([name, quota], tenant.refused.get(quota, 0))
    yield from (weight, queued, inflight, work, rate, thinking, e2e_p95, wait_p95, limit, refused)


def window_series(window: WindowReading) -> Iterator[Metric]:
    """Windowed gauges: cache efficiency, throughput and thinking share over the last ``window_s`` seconds."""
    def gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, value=_value(value))

    yield gauge("modgate_window_seconds", "Length of the window the modgate_window_* gauges cover.",
                window.window_s)
    yield gauge(
        "modgate_window_prompt_cached_ratio",
        "Cached / prompt tokens of the gateway's own engine calls over the window (NaN: no calls).",
        window.prompt_cached_ratio,
    )
    yield gauge(
        "modgate_window_engine_prefix_cache_hit_ratio",
        "Increase of vllm:prefix_cache_hits_total over the increase of vllm:prefix_cache_queries_total "
        "between scrapes of the engine across the window (NaN: nothing queried). Never since start.",
        window.engine_hit_ratio,
    )
    yield gauge(
        "modgate_window_engine_prefix_cache_queries_tokens",
        "Prompt tokens the engine looked up in its prefix cache over the window.",
        window.engine_queried_tokens,
    )
    yield gauge("modgate_window_keyframes_per_minute", "Keyframes answered per minute over the window.",
                window.keyframes_per_minute)
    yield gauge(
        "modgate_window_thinking_share",
        "Share of engine-judged keyframes with thinking on over the window (NaN: none).",
        window.thinking_share,
    )
    yield gauge(
        "modgate_window_escalation_share",
        "Share of engine-judged escalate-mode keyframes asked again with thinking on (NaN: none).",
        window.escalation_share,
    )
    yield gauge("modgate_thinking_default_on", "1 when the thinking policy's default mode is on, else 0.",
                1.0 if window.thinking_default_on else 0.0)
    if window.kv_block_size is not None:
        yield gauge(
            "modgate_engine_kv_block_size_tokens",
            "The engine's KV block size (vllm:cache_config_info): shorter prefixes never hit.",
            window.kv_block_size,
        )


class Scraped(Collector):
    """Series computed by a function at scrape time."""

    def __init__(self, source: Callable[[], Iterator[Metric]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        """Read the source now."""
        yield from self.source()
