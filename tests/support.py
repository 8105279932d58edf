"""Helpers the tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx

from cli.embedded import ThreadedServer
from deploy.simulator import PRESETS, create_sim_app
from gateway.engine.wires import EngineKind

ADMIN_TOKEN = "test-admin-token-0123456789"

SimFactory = Callable[..., ThreadedServer]
GatewayFactory = Callable[..., ThreadedServer]


class FakeClock:
    """A clock that moves only when the test says so: set ``now`` or ``advance`` it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def merged_settings(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Settings keywords: ``overrides`` over ``defaults``, a group's fields merged (``engine={"url": u}`` over
    ``engine={"max_inflight": 1}`` keeps both)."""
    merged = dict(defaults)
    for name, value in overrides.items():
        current = merged.get(name)
        both_groups = isinstance(current, dict) and isinstance(value, dict)
        merged[name] = {**current, **value} if both_groups else value
    return merged


def data_url(image: bytes, mime: str = "image/jpeg") -> str:
    """A ``data:`` URL for image bytes."""
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def image_input(*frames: bytes) -> list[dict[str, Any]]:
    """Moderation ``input`` parts for JPEG frames."""
    return [{"type": "image_url", "image_url": {"url": data_url(frame)}} for frame in frames]


async def forward(request: httpx.Request, base_url: str) -> httpx.Response:
    """Send ``request`` on to the server at ``base_url`` and answer what it answers: an engine transport
    (``httpx.MockTransport``) that records or alters some calls passes the others to a real simulator."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        upstream = await http.request(
            request.method,
            request.url.path,
            content=request.content,
            headers={"content-type": "application/json"},
        )
    return httpx.Response(upstream.status_code, content=upstream.content, headers=upstream.headers)


class SwappableEngine:
    """A simulated engine on a fixed port that can be restarted serving another model (new weights), or
    stopped and started again; ``kind="llamacpp"`` speaks llama-server's wire."""

    def __init__(self, kind: EngineKind = "vllm") -> None:
        self.kind = kind
        self.server = ThreadedServer(self._app()).start()
        self.url = self.server.url

    def _app(self, **preset_changes: Any) -> Any:
        return create_sim_app(PRESETS["instant"].scaled(**preset_changes), 0.0, kind=self.kind)

    def swap(self, **preset_changes: Any) -> None:
        """Stop the engine and start another on the same port with ``preset_changes``."""
        self.server.stop()
        self.start(**preset_changes)

    def stop(self) -> None:
        """Stop serving (connections to its port are refused until :meth:`start`)."""
        self.server.stop()

    def start(self, **preset_changes: Any) -> None:
        """Serve again on the same port."""
        self.server = ThreadedServer(self._app(**preset_changes), port=self.server.port).start()

    def used(self) -> bool:
        """Whether this run of the engine has taken a chat completion."""
        info = httpx.get(f"{self.url}/sim/info", timeout=10).json()
        return bool(info["peak_running"] > 0)
