"""The two paths of the overhead benchmark: which keyframes, which gateway settings, which request bytes.

``cheapest``: one frame already on the token grid, no verdict cache, state in memory, no export.
``production``: photo-like 1280×720 keyframes that must be shaped, Redis, the verdict cache on with every
lookup a miss (a keyframe is never sent twice by one tenant; verdicts are scoped by tenant), OTLP export.

The direct arms post exactly what modgate sent the engine for each keyframe (``capture``), so every arm
asks the engine the same request.
"""

from __future__ import annotations

import base64
import json
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.keepalive import KeepAliveConnection
from deploy.keyframes import make_keyframe
from gateway.settings import Settings
from shaping.image import ImageLimits, shape_image
from shaping.tokens import TokenGrid

PATHS = ("cheapest", "production")
PRODUCTION_FRAME = (1280, 720)
SEED_BASE = {"cheapest": 5, "production": 1000}


@dataclass(frozen=True)
class Callers:
    """The API keys of one gateway: one for the capture, then ``tenants`` for the timed requests."""

    capture: str
    tenants: list[str]

    @classmethod
    def make(cls, tenants: int) -> Callers:
        """Fresh random keys."""
        keys = ["bench-" + secrets.token_hex(16) for _ in range(tenants + 1)]
        return cls(keys[0], keys[1:])

    def api_keys(self, path: str) -> str:
        """``MODGATE_AUTH__API_KEYS``: each key its own tenant, named afresh each run (verdicts are scoped by
        tenant, so a Redis that kept an earlier run's verdicts has none for these)."""
        run = secrets.token_hex(4)
        keys = [self.capture, *self.tenants]
        return ",".join(f"{key}:{path}-{run}-{index}" for index, key in enumerate(keys))


def encode_head(url: str, length: int) -> bytes:
    """A ``POST``'s request line and headers up to (not including) the caller's own header lines."""
    parts = httpx.URL(url)
    return (f"POST {parts.raw_path.decode()} HTTP/1.1\r\nHost: {parts.netloc.decode()}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n").encode()


@dataclass
class Arm:
    """One way to get keyframes judged: where to post, the bodies, the callers, and the connections.

    Request ``j`` is body ``j mod B`` with caller ``(j div B) mod C``: with one body per keyframe and a
    caller per tenant, no tenant sends a keyframe twice before ``B × C`` requests.
    """

    url: str
    bodies: list[bytes]
    callers: list[bytes]  # header lines (each ending in CRLF) a caller adds, e.g. its Authorization
    pool: list[KeepAliveConnection] = field(default_factory=list)
    sent: int = 0
    name: str = ""  # the arm's name in the table, for an error to say whose it is

    def __post_init__(self) -> None:
        self._heads = [encode_head(self.url, len(body)) for body in self.bodies]

    @property
    def distinct(self) -> int:
        """How many requests go out before one repeats."""
        return len(self.bodies) * len(self.callers)

    def next_request(self) -> bytes:
        """The next request's bytes."""
        index = self.sent
        self.sent += 1
        body = index % len(self.bodies)
        caller = self.callers[(index // len(self.bodies)) % len(self.callers)]
        return self._heads[body] + caller + b"\r\n" + self.bodies[body]

    def connections(self, concurrency: int) -> list[KeepAliveConnection]:
        """``concurrency`` connections, kept from one round to the next."""
        while len(self.pool) < concurrency:
            self.pool.append(KeepAliveConnection(self.url))
        return self.pool[:concurrency]


def authorization(key: str, *extra: str) -> bytes:
    """Header lines: the bearer key, then ``extra`` (``Name: value``)."""
    return "".join(f"{line}\r\n" for line in (f"Authorization: Bearer {key}", *extra)).encode()


@dataclass(frozen=True)
class PathFrames:
    """One path's source keyframes (what callers post to modgate)."""

    path: str
    width: int
    height: int
    sources: list[bytes]

    @classmethod
    def make(cls, path: str, width: int, height: int, count: int) -> PathFrames:
        """``count`` photo-like keyframes of ``width``×``height``, seeds of their own per path."""
        base = SEED_BASE[path]
        return cls(path, width, height, [make_keyframe("allow", width, height, seed=base + i)
                                         for i in range(count)])

    def moderation_bodies(self) -> list[bytes]:
        """``POST /v1/moderations`` bodies, one per keyframe."""
        return [json.dumps({
            "model": "modgate-moderation",
            "input": [{"type": "image_url",
                       "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(frame).decode()}}],
        }).encode() for frame in self.sources]

    def shaping_times(self) -> list[float]:
        """Seconds of modgate's shaping step (``shape_image``, its settings) on each of these keyframes, one
        thread, in this process: what any gateway that resizes must spend."""
        settings = Settings()
        shaping = settings.shaping
        grid = TokenGrid(pixels_per_token=shaping.pixels_per_token, token_budget=shaping.image_token_budget)
        limits = ImageLimits(max_bytes=shaping.max_image_bytes, animated=shaping.animated,
                             max_pixels_decoded=settings.limits.max_image_pixels)
        times = []
        for frame in self.sources:
            started = time.perf_counter()
            shape_image(frame, limits, grid, jpeg_quality=shaping.jpeg_quality)
            times.append(time.perf_counter() - started)
        return times

    def shaped(self) -> dict[str, Any]:
        """What shaping makes of the first keyframe."""
        settings = Settings()
        shaping = settings.shaping
        grid = TokenGrid(pixels_per_token=shaping.pixels_per_token, token_budget=shaping.image_token_budget)
        frame = shape_image(self.sources[0], ImageLimits(), grid, jpeg_quality=shaping.jpeg_quality)
        return {"shaped": f"{frame.width}x{frame.height}", "image_tokens": frame.image_tokens,
                "passthrough": frame.passthrough}


def shaping_floor(times: list[float], shaped: dict[str, Any]) -> dict[str, Any]:
    """The median of the shaping times, with what the shaping made."""
    return {"median_ms": statistics.median(times) * 1e3, "samples": len(times), **shaped}


def gateway_environment(path: str, callers: Callers, redis_url: str, otlp_url: str) -> dict[str, str]:
    """modgate as benchmarked on ``path``: production defaults (the in-flight cap of 8 included) and API keys;
    the cheapest path without the verdict cache, the production one with Redis and OTLP export."""
    environment = {"MODGATE_AUTH__API_KEYS": callers.api_keys(path)}
    if path == "cheapest":
        return {**environment, "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0"}
    return {**environment, "MODGATE_REDIS__URL": redis_url, "MODGATE_TELEMETRY__OTLP_ENDPOINT": otlp_url}


async def capture(http: httpx.AsyncClient, gateway_url: str, engine_url: str, key: str,
                  frames: PathFrames) -> list[bytes]:
    """Each keyframe once through modgate (its capture caller): the engine body it sent, byte for byte.

    Each answer must be a verdict the engine made (a fast error is not a fast gateway).
    """
    sent: list[bytes] = []
    for body in frames.moderation_bodies():
        before = (await http.get(f"{engine_url}/stub/info")).json()["requests"]
        response = await http.post(
            f"{gateway_url}/v1/moderations", content=body,
            headers={"Content-Type": "application/json", "X-Modgate-Thinking": "off",
                     "Authorization": f"Bearer {key}"},
        )
        made = response.status_code == 200 and response.json()["results"][0]["modgate"]["reason"] is None
        asked = (await http.get(f"{engine_url}/stub/info")).json()["requests"] - before
        if not made or asked != 1:
            raise RuntimeError(f"modgate did not ask the engine once for a {frames.path} keyframe (asked "
                               f"{asked}): {response.status_code} {response.text[:300]}")
        sent.append((await http.get(f"{engine_url}/stub/last")).content)
    return sent


def litellm_body(engine_body: bytes, served_name: str) -> bytes:
    """The engine request as a LiteLLM caller posts it: the same, under the proxy's model name."""
    request: dict[str, Any] = json.loads(engine_body)
    return json.dumps({**request, "model": served_name}).encode()


def reused_verdicts(metrics_text: str) -> float:
    """``modgate_reused_verdicts_total`` summed over kinds, from a gateway's /metrics."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("modgate_reused_verdicts_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total
