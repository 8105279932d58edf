"""What the handlers share, built once per app in the lifespan and closed in ``finally``."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from gateway.admission import AdmissionQueue
from gateway.auth import KeyRing
from gateway.embedded import ThreadedServer
from gateway.engine_client import EngineClient
from gateway.moderation import ModerationService
from gateway.policy import MemoryPolicyStore, PolicyStore
from gateway.settings import Settings
from gateway.telemetry import GatewayMetrics
from shaping.prompt import load_system_prompt

log = logging.getLogger("modgate.gateway")


@dataclass
class Services:
    """The app's long-lived parts."""

    settings: Settings
    keys: KeyRing
    engine: EngineClient
    admission: AdmissionQueue
    policies: PolicyStore
    metrics: GatewayMetrics
    moderation: ModerationService


def _start_simulator(settings: Settings) -> ThreadedServer:
    from deploy.simulator import PRESETS, create_sim_app

    preset = PRESETS[settings.simulator.preset]
    server = ThreadedServer(create_sim_app(preset, settings.simulator.time_scale)).start()
    log.warning(
        "MODGATE_ENGINE_URL is unset: using the built-in simulated engine at %s (%s preset, time scale %g)",
        server.url, preset.name, settings.simulator.time_scale,
    )
    return server


@asynccontextmanager
async def open_services(
    settings: Settings, keys: KeyRing, engine_transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[Services]:
    """Build every client the handlers need; close them all on the way out."""
    simulator: ThreadedServer | None = None
    executor = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="shaping")
    if engine_transport is not None:
        engine_url = "http://engine.test"
    elif settings.engine_url:
        engine_url = settings.engine_url
    else:
        simulator = await asyncio.to_thread(_start_simulator, settings)
        engine_url = simulator.url
    engine = EngineClient(
        engine_url,
        connect_timeout_s=settings.engine.connect_timeout_s,
        first_token_timeout_s=settings.engine.first_token_timeout_s,
        total_timeout_s=settings.engine.total_timeout_s,
        connect_retries=settings.engine.connect_retries,
        max_connections=settings.max_inflight * 2,
        transport=engine_transport,
    )
    admission = AdmissionQueue(settings.max_inflight, settings.admission.queue_size, settings.admission.queue_timeout_s)
    policies = MemoryPolicyStore()
    metrics = GatewayMetrics()
    moderation = ModerationService(
        settings=settings,
        engine=engine,
        admission=admission,
        policies=policies,
        metrics=metrics,
        system_prompt=load_system_prompt(),
        executor=executor,
    )
    try:
        yield Services(settings, keys, engine, admission, policies, metrics, moderation)
    finally:
        await engine.aclose()
        executor.shutdown(wait=False, cancel_futures=True)
        if simulator is not None:
            await asyncio.to_thread(simulator.stop)
