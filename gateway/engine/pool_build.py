"""The engine pool as the settings describe it, and its ``modgate_engine_*`` gauges read at scrape time."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from redis.asyncio import Redis

from gateway.engine.admission import AdmissionQueue
from gateway.engine.circuit import CircuitBreaker
from gateway.engine.client import EngineClient
from gateway.engine.engine_slot import EngineSlot
from gateway.engine.leases import EngineLeases
from gateway.engine.pool import EnginePool
from gateway.series.metrics import GatewayMetrics
from gateway.series.scraped import EngineReading, PoolReading, SharedCapReading
from gateway.settings import EngineSettings, Settings


def register_pool_metrics(pool: EnginePool, metrics: GatewayMetrics) -> None:
    """Per-engine gauges (label ``engine``) on the gateway's metrics, read at scrape time."""
    metrics.watch_pool(lambda: pool_reading(pool))


def pool_reading(pool: EnginePool) -> PoolReading:
    """The pool's figures now, for ``modgate_engine_*{engine}`` (gateway/series/scraped.py)."""
    engines = tuple(
        # A cool-down that passed is no news of the engine: half-open stays down until its probe succeeds,
        # so a dead engine that no call probes (the others take them) reads down for as long as it is.
        EngineReading(url=engine.url, inflight=engine.inflight, cap=engine.cap, up=engine.state == "closed",
                      failovers=engine.failovers, busy=engine.busy_answers)
        for engine in pool.engines
    )
    if pool.leases is None:
        return PoolReading(engines)
    # Redis answering again does not end the overshoot: the calls admitted meanwhile run on.
    outside = pool.calls_on_local_caps + len(pool.leases.running_unleased)
    return PoolReading(engines, SharedCapReading(local_only=pool.leases_local_only, outside=outside))


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
