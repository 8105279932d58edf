"""Processes the reliability tests start and kill: gateways, a Redis of their own, a webhook receiver."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import free_port, wait_until_ready

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
WEBHOOK_SECRET = "test-webhook-secret-0123456789"


def poll(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    """Call ``condition`` until it answers something truthy (and answer it), or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


async def poll_async(condition: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> Any:
    """``poll`` for coroutines: await ``condition`` until it answers something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class GatewayProcess:
    """``modgate serve`` in a process of its own: it can be killed like a real deployment."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        """``kill -9``: no shutdown hook runs."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """Terminate if still running."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def peak_rss_bytes(self) -> int:
        """The process's peak resident memory (``VmHWM``)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc status")

    def log(self) -> str:
        """What the gateway printed (for failure messages)."""
        return self.log_path.read_text(errors="replace")[-4000:]


GatewayProcessFactory = Callable[..., GatewayProcess]


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[GatewayProcessFactory]:
    """Start ``modgate serve`` processes with ``MODGATE_*`` variables; all stopped after the test."""
    started: list[GatewayProcess] = []

    def start(**env: str) -> GatewayProcess:
        port = free_port()
        log_path = tmp_path / f"gateway-{port}.log"
        variables = {
            **os.environ,
            "MODGATE_LOG_LEVEL": "warning",
            **env,
        }
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
                env=variables, stdout=log, stderr=subprocess.STDOUT,
            )
        gateway = GatewayProcess(f"http://127.0.0.1:{port}", process, log_path)
        started.append(gateway)
        try:
            wait_until_ready(f"{gateway.url}/healthz", process)
        except RuntimeError as exc:
            pytest.fail(f"{exc}\n{gateway.log()}")
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@dataclass
class RedisServer:
    """A redis-server of the test's own (not the machine's 6379); every write persisted (AOF, fsync)."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start (again, on the same port and data directory) and wait until it answers PING."""
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        poll(answers, 20, f"redis-server on port {self.port}")
        client.close()
        return self

    def stop(self) -> None:
        """Shut down (SIGTERM: the append-only file is flushed first)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)
        self.process = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis the test may stop and restart."""
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory).start()
    yield server
    server.stop()


@dataclass
class Delivery:
    """One webhook request the receiver got."""

    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body, parsed."""
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """A local HTTP server that records every POST (and can refuse the first few with 500)."""

    url: str
    deliveries: list[Delivery]
    fail_first: list[int]

    def by_job(self) -> dict[str, list[Delivery]]:
        """Deliveries grouped by ``X-Modgate-Delivery``."""
        grouped: dict[str, list[Delivery]] = {}
        for delivery in list(self.deliveries):
            grouped.setdefault(delivery.headers["x-modgate-delivery"], []).append(delivery)
        return grouped


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    """Records webhooks on ``http://127.0.0.1:<port>/hook``."""
    deliveries: list[Delivery] = []
    fail_first = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with lock:
                refuse = fail_first[0] > 0
                fail_first[0] -= 1 if refuse else 0
                if not refuse:
                    deliveries.append(Delivery({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(500 if refuse else 204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield WebhookReceiver(f"http://127.0.0.1:{server.server_address[1]}/hook", deliveries, fail_first)
    server.shutdown()
    server.server_close()


def error_body(response: httpx.Response) -> dict[str, Any]:
    """The OpenAI error shape's inner object, after checking the shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def engine_counter(metrics_text: str, name: str) -> float:
    """A counter's value from Prometheus text."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in (name, f"{name}_total"):
                return float(sample.value)
    raise AssertionError(f"no {name} in the engine's metrics")
