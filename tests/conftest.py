"""Shared fixtures: servers on loopback (the simulator, the gateway, gateway processes) and a real Redis."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, Faults, SimPreset, create_sim_app
from deploy.simulator.llamacpp_law import LlamaCppOptions
from gateway.engine.wires import EngineKind
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.processes import GatewayProcess, GatewayProcessesFactory, RedisServer
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, SwappableEngine, merged_settings

_LLAMACPP_FIXTURES = ("real_llamacpp_url", "real_hybrid_llamacpp_url")


def needs_real_llamacpp(item: pytest.Item) -> bool:
    """Whether a test uses the real llama-server (its marker, or one of its fixtures)."""
    names = getattr(item, "fixturenames", ())
    return item.get_closest_marker("llamacpp") is not None or any(n in names for n in _LLAMACPP_FIXTURES)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the real llama-server run last, each in its order: scripts/test builds llama.cpp in the
    background while the rest of the suite runs, and the first of them waits for the build (its lock)."""
    items[:] = sorted(items, key=needs_real_llamacpp)  # stable: False (the rest) first

# The engine start-up check (gateway/engine/startup_check.py) asks each engine a few chat completions at
# start: tests that count an engine's calls or script its faults would see them, so the suite turns it off
# (gateways it starts as processes inherit this); tests/engine_check/ turns it on where it is tested.
os.environ.setdefault("MODGATE_ENGINE__STARTUP_CHECK", "false")
# Video jobs wait as files in the spool (MODGATE_VIDEOS__SPOOL_DIR, var/videos by default): the session's
# gateways share one of its own, never the checkout's var/.
if "MODGATE_VIDEOS__SPOOL_DIR" not in os.environ:
    os.environ["MODGATE_VIDEOS__SPOOL_DIR"] = tempfile.mkdtemp(prefix="modgate-spool-")
    atexit.register(shutil.rmtree, os.environ["MODGATE_VIDEOS__SPOOL_DIR"], ignore_errors=True)

REDIS_URL = os.environ.get("MODGATE_TEST_REDIS_URL", "")
"""A Redis the tests may flush (``MODGATE_TEST_REDIS_URL``); unset, each test session starts its own."""


@pytest.fixture
def keyframe() -> bytes:
    """One 1280×720 keyframe labelled block:violence."""
    return make_keyframe("block:violence", seed=1)


@pytest.fixture
def start_sim() -> Iterator[SimFactory]:
    """Start simulators (``start_sim(preset=..., time_scale=..., faults=...)``), stopped after the test;
    ``kind="llamacpp"`` (``llamacpp=LlamaCppOptions(...)``, ``vision=...``) speaks llama-server's wire."""
    servers: list[ThreadedServer] = []

    def start(
        preset: SimPreset | str = "instant",
        time_scale: float = 0.0,
        faults: Faults | None = None,
        *,
        kind: EngineKind = "vllm",
        llamacpp: LlamaCppOptions | None = None,
        vision: bool = True,
        **changes: Any,
    ) -> ThreadedServer:
        chosen = PRESETS[preset] if isinstance(preset, str) else preset
        started: list[ThreadedServer] = []  # the server, for the app to exit as vLLM does when its core dies
        app = create_sim_app(
            chosen.scaled(**changes), time_scale, faults, kind=kind, llamacpp=llamacpp, vision=vision,
            on_exit=lambda: started[0].exit_soon(),
        )
        server = ThreadedServer(app).start()
        started.append(server)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def sim(start_sim: SimFactory) -> ThreadedServer:
    """An instant simulator (small prefix-cache blocks, no time spent)."""
    return start_sim()


@pytest.fixture
def start_gateway() -> Iterator[GatewayFactory]:
    """Start gateways on loopback (``start_gateway(engine={"url": ...}, **settings)``), stopped after the
    test."""
    servers: list[ThreadedServer] = []

    def start(**overrides: Any) -> ThreadedServer:
        fields = merged_settings({"auth": {"admin_token": ADMIN_TOKEN}}, overrides)
        server = ThreadedServer(create_app(Settings(**fields))).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def gateway(start_gateway: GatewayFactory, sim: ThreadedServer) -> ThreadedServer:
    """A gateway in front of the instant simulator."""
    return start_gateway(engine={"url": sim.url})


@pytest.fixture
def gateway_processes(tmp_path: Path) -> Iterator[GatewayProcessesFactory]:
    """``gateway_processes(count, ready_path="/readyz", **MODGATE_env)``: ``python -m cli.main serve``
    processes started side by side (their imports overlap), each waited for until ``ready_path`` answers 200
    (``/healthz`` where Redis or the engine may be away); all stopped after the test."""
    started: list[GatewayProcess] = []

    def start(count: int, ready_path: str = "/readyz", **env: str) -> list[GatewayProcess]:
        batch = [GatewayProcess.spawn(tmp_path, env) for _ in range(count)]
        started.extend(batch)
        for gateway in batch:
            gateway.wait_ready(ready_path)
        return batch

    yield start
    for gateway in started:  # all drain at once: each waits MODGATE_SERVER__DRAIN_S after SIGTERM
        gateway.terminate()
    for gateway in started:
        gateway.stop()


@pytest.fixture(scope="session")
def session_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Redis of this test session: ``MODGATE_TEST_REDIS_URL`` when set, else a ``redis-server`` of the
    session's own on a free port. Never a database of the machine's shared 6379 by default: the tests
    flush their database, and another session's flush (or its gateways on the same stream) there wiped
    this session's keys mid-test (every job of the drain test "gone")."""
    if REDIS_URL:
        yield REDIS_URL
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_url(session_redis: str) -> Iterator[str]:
    """A real Redis (flushed before and after). Fails, never skips, when none answers."""
    client = redis.Redis.from_url(session_redis, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"these tests need a real Redis at {session_redis} (scripts/test starts one): {exc}")
    client.flushdb()
    yield session_redis
    client.flushdb()
    client.close()


@pytest.fixture
def mixed() -> Iterator[tuple[SwappableEngine, SwappableEngine]]:
    """A simulated vLLM and a simulated llama.cpp server serving the same model id."""
    vllm, llamacpp = SwappableEngine(), SwappableEngine("llamacpp")
    yield vllm, llamacpp
    vllm.server.stop()
    llamacpp.server.stop()
