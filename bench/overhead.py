"""The gateway's added latency per request over an engine that takes no time.

The simulator (instant preset, time scale 0) and the gateway each run in a process of their own; one client
posts the same keyframe in a closed loop, first straight to the engine (the chat request the gateway would
build), then as a moderation request through the gateway. Added latency = gateway minus direct.

    python -m bench.overhead [--requests 300] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx

from bench.servers import gateway, simulator
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS
from shaping.prompt import RequestOptions, build_chat_request, load_system_prompt


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def closed_loop(call: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> list[float]:
    """Latencies of ``requests`` calls made by ``concurrency`` clients back to back."""
    latencies: list[float] = []
    remaining = requests

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


class Frame:
    """A keyframe already on the token grid (1056×640), so shaping passes it through."""

    def __init__(self, width: int, height: int) -> None:
        self.data = make_keyframe("allow", width, height, seed=5)
        self.data_url = "data:image/jpeg;base64," + base64.b64encode(self.data).decode()
        self.sha256 = "bench"


async def measure(requests: int, concurrency: int, width: int, height: int) -> dict[str, list[float]]:
    """Direct-to-engine and through-the-gateway latencies, side by side."""
    frame = Frame(width, height)
    chat = build_chat_request(load_system_prompt(), [frame], "请审核这张视频关键帧截图。",
                              RequestOptions(model=PRESETS["instant"].model, enable_thinking=False,
                                             max_completion_tokens=64))
    moderation = {"model": "modgate-moderation",
                  "input": [{"type": "image_url", "image_url": {"url": frame.data_url}}]}
    with simulator("instant", 0.0) as engine_url, gateway(engine_url) as gateway_url:
        limits = httpx.Limits(max_connections=concurrency * 2)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:

            async def direct() -> None:
                async with http.stream("POST", f"{engine_url}/v1/chat/completions", json=chat) as response:
                    async for _ in response.aiter_lines():
                        pass
                    response.raise_for_status()

            async def through_gateway() -> None:
                response = await http.post(f"{gateway_url}/v1/moderations", json=moderation,
                                           headers={"X-Modgate-Thinking": "off"})
                response.raise_for_status()

            await closed_loop(direct, 20, concurrency)  # warm up both paths
            await closed_loop(through_gateway, 20, concurrency)
            return {
                "direct": await closed_loop(direct, requests, concurrency),
                "gateway": await closed_loop(through_gateway, requests, concurrency),
            }


def main() -> None:
    """Print medians, p99s and the added latency."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.requests} requests per path, {args.concurrency} client(s), instant simulator (time scale 0)")
    print(f"{'frame':<22}{'path':<10}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}")
    for width, height, label in ((1056, 640, "1056x640 (on grid)"), (1280, 720, "1280x720 (resized)")):
        results = asyncio.run(measure(args.requests, args.concurrency, width, height))
        for path, latencies in results.items():
            rps = args.concurrency / statistics.mean(latencies)
            print(f"{label:<22}{path:<10}{statistics.median(latencies) * 1e3:>9.2f}"
                  f"{percentile(latencies, 99) * 1e3:>9.2f}{rps:>9.1f}")
        added_p50 = (statistics.median(results["gateway"]) - statistics.median(results["direct"])) * 1e3
        added_p99 = (percentile(results["gateway"], 99) - percentile(results["direct"], 99)) * 1e3
        ratio = statistics.median(results["gateway"]) / statistics.median(results["direct"])
        print(f"{label:<22}{'added':<10}{added_p50:>9.2f}{added_p99:>9.2f}   gateway/direct p50 = {ratio:.2f}x")


if __name__ == "__main__":
    main()
