"""What the reliability tests start and kill (gateways, a Redis of their own, a webhook receiver), and
checks of error bodies and engine counters."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import GatewayProcess, GatewayProcessesFactory, GatewayProcessFactory, RedisServer

WEBHOOK_SECRET = "test-webhook-secret-0123456789"


@pytest.fixture
def gateway_process(gateway_processes: GatewayProcessesFactory) -> GatewayProcessFactory:
    """Start ``modgate serve`` processes with ``MODGATE_*`` variables, each ready once it answers /healthz;
    all stopped after the test."""

    def start(**env: str) -> GatewayProcess:
        (gateway,) = gateway_processes(1, "/healthz", **env)
        return gateway

    return start


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis the test may stop and restart; every write persisted (append-only file, fsync always)."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
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
