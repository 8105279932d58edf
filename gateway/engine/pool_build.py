"""The engine pool as the settings describe it, and its ``modgate_engine_*`` gauges read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from gateway.engine.admission import AdmissionQueue
from gateway.engine.circuit import CircuitBreaker
from gateway.engine.client import EngineClient
from gateway.engine.engine_slot import EngineSlot
from gateway.engine.leases import EngineLeases
from gateway.engine.pool import EnginePool
from gateway.settings import EngineSettings, Settings


def register_pool_metrics(pool: EnginePool, registry: CollectorRegistry) -> None:
    """Per-engine gauges (label ``engine``) on the gateway's registry, read at scrape time."""
    registry.register(PoolCollector(pool))


class PoolCollector(Collector):
    """``modgate_engine_*{engine="<url>"}`` gauges, computed at scrape time."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        """Read the pool now."""
        pool = self.pool
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
            busy.add_metric([engine.url], engine.busy_answers)
            inflight.add_metric([engine.url], engine.inflight)
            cap.add_metric([engine.url], engine.cap)
            # A cool-down that passed is no news of the engine: half-open stays 0 until its probe succeeds, so
            # a dead engine that no call probes (the others take them) reads down for as long as it is.
            up.add_metric([engine.url], 1.0 if engine.state == "closed" else 0.0)
            failovers.add_metric([engine.url], engine.failovers)
        yield from (inflight, cap, up, failovers, busy)
        if pool.leases is not None:
            yield GaugeMetricFamily(
                "modgate_engine_leases_local_only",
                "1 while Redis is unreachable and engine caps hold per replica only.",
                value=1.0 if pool.leases_local_only else 0.0,
            )
            # Redis answering again does not end the overshoot: the calls admitted meanwhile run on.
            yield GaugeMetricFamily(
                "modgate_engine_calls_outside_shared_cap",
                "Calls this replica has at the engines that the shared cap does not count: admitted on its"
                " local caps while Redis was unreachable, or whose lease was lost (expired unrenewed, or"
                " not yet replicated when the primary failed); the engines may exceed their caps by these.",
                value=pool.calls_on_local_caps + len(pool.leases.running_unleased),
            )


def build_engine_pool(
    settings: Settings,
    urls: list[str],
    transport: httpx.AsyncBaseTransport | None = None,
    weight: Callable[[str], float] | None = None,
    state: Redis | None = None,
) -> EnginePool:
    """The pool the settings describe: a client, circuit breaker and cap per URL; leases in ``state`` (the
    service's Redis client) when there is one."""
    engines = []
    for url in urls:
        cap = settings.engine_cap(url)
        circuit = CircuitBreaker(url, **settings.circuit.model_dump())
        client = EngineClient(
            url,
            connect_timeout_s=settings.engine.connect_timeout_s,
            first_token_timeout_s=settings.engine.first_token_timeout_s,
            total_timeout_s=settings.engine.total_timeout_s,
            connect_retries=settings.engine.connect_retries,
            max_connections=cap * 2,
            transport=transport,
            circuit=circuit,
            kind=settings.engine.kind_of(url),
            props_recheck_s=settings.engine.model_recheck_s,  # /props re-read as often as /v1/models
        )
        configured = url in settings.engine_cap_map()
        # an engine that may name its slots takes one call until they are read (engine/slot_readings.py)
        engines.append(EngineSlot(client, cap, circuit, cap_configured=configured,
                                  slots_unknown=not configured and client.kind != "vllm"))
    admission = settings.admission
    total_cap = sum(engine.cap for engine in engines)
    queue = AdmissionQueue(total_cap, admission.queue_size, admission.queue_timeout_s,
                           fairness=admission.fairness, weight=weight or (lambda _tenant: 1.0))
    group = settings.leases
    fair = group.fair_share and admission.fairness == "tenant"
    leases = None
    if state is not None and group.enabled:
        leases = EngineLeases(
            state, key_prefix=group.key_prefix, ttl_s=group.ttl_s, renew_every_s=group.renew_every_s,
            timeout_s=group.redis_timeout_s,
        )
    return EnginePool(
        engines, queue, leases, lease_retry_after_failure_s=group.retry_after_failure_s,
        # Fair leases poll sooner: a freed slot waits for the poll of the one tenant it may go to.
        lease_poll_s=(0.01, 0.05) if fair else (0.01, 0.1),
        fair_leases=fair, weight=weight or (lambda _tenant: 1.0),
    )


def tool_client(
    url: str, engine: EngineSettings, transport: httpx.AsyncBaseTransport | None = None
) -> EngineClient:
    """An engine client for a command-line tool (a cache probe, a cache plan): the engine settings'
    timeouts and kind, two connections, no circuit (a tool's calls are few and its operator is watching)."""
    return EngineClient(
        url.rstrip("/"),
        connect_timeout_s=engine.connect_timeout_s,
        first_token_timeout_s=engine.first_token_timeout_s,
        total_timeout_s=engine.total_timeout_s,
        connect_retries=engine.connect_retries,
        max_connections=2,
        transport=transport,
        kind=engine.kind_of(url),
    )
