"""The simulator's Spark preset against the Spark's measured baseline (docs/spark.md).

Seed request shape: the canonical system prompt (~416 tokens), one 660-token image (1056×640 at 32×32 pixels
per token), the fixed instruction, thinking on (~95 output tokens); 8 clients in a closed loop, straight to
the simulated engine (no gateway). Durations run at ``--time-scale`` and are scaled back to the Spark's pace.

    python -m bench.calibration [--time-scale 0.25] [--requests 96] [--arrivals-per-min 46.7]

The simulator runs in a process of its own; run it on a quiet machine (it measures a paced simulation).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import httpx

from bench.servers import simulator
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS
from shaping.image import ImageLimits, ShapedImage, shape_image
from shaping.prompt import RequestOptions, build_chat_request, load_system_prompt
from shaping.tokens import TokenGrid

SPARK = {"requests_per_min": 46.7, "ttft_s": 0.468, "e2e_s": 8.56}


def seed_frame() -> ShapedImage:
    """The seed's image, shaped as the gateway shapes it: 1056×640 is exactly 33×20 = 660 tokens."""
    return shape_image(make_keyframe("allow", 1056, 640, seed=11), ImageLimits(), TokenGrid(token_budget=660))


async def run(
    time_scale: float, requests: int, concurrency: int, arrivals_per_min: float | None = None
) -> dict[str, float]:
    """Closed loop at ``concurrency`` (or open loop at ``arrivals_per_min``); figures at the Spark's pace."""
    body = build_chat_request(
        load_system_prompt(),
        [seed_frame()],
        "请审核这张视频关键帧截图。",
        RequestOptions(model=PRESETS["spark"].model, enable_thinking=True, max_completion_tokens=512),
    )
    with simulator("spark", time_scale) as sim_url:
        ttfts: list[float] = []
        e2es: list[float] = []
        usage: dict[str, object] = {}
        remaining = requests

        async def client(http: httpx.AsyncClient, stagger_s: float = 0.0) -> None:
            nonlocal remaining, usage
            await asyncio.sleep(stagger_s)
            while remaining > 0:
                remaining -= 1
                started = time.monotonic()
                first = None
                async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        if first is None and ('"reasoning"' in line or '"content":"{' in line):
                            first = time.monotonic()
                        if '"usage"' in line and '"choices":[]' in line.replace(" ", ""):
                            usage = httpx.Response(200, content=line[5:]).json()["usage"]
                e2es.append(time.monotonic() - started)
                ttfts.append((first or time.monotonic()) - started)

        async def one(http: httpx.AsyncClient, delay: float) -> None:
            nonlocal remaining
            await asyncio.sleep(delay)
            remaining = 1
            await client(http)

        async with httpx.AsyncClient(base_url=sim_url, timeout=600) as http:
            started = time.monotonic()
            if arrivals_per_min is None:
                # Staggered starts, as live traffic arrives: clients that start together stay in step and
                # queue their prefills behind each other, a burst the Spark's steady traffic did not have.
                spacing = SPARK["e2e_s"] / concurrency * (time_scale or 1.0)
                await asyncio.gather(*(client(http, i * spacing) for i in range(concurrency)))
            else:  # Poisson arrivals, seeded: the production traffic's shape rather than a closed loop
                rng = random.Random(0)
                at, delays = 0.0, []
                for _ in range(requests):
                    at += rng.expovariate(arrivals_per_min / 60) * (time_scale or 1.0)
                    delays.append(at)
                await asyncio.gather(*(one(http, delay) for delay in delays))
            elapsed = time.monotonic() - started
    scale = time_scale or 1.0
    return {
        "requests_per_min": requests / (elapsed / scale) * 60,
        "ttft_mean_s": statistics.mean(ttfts) / scale,
        "ttft_p50_s": statistics.median(ttfts) / scale,
        "e2e_mean_s": statistics.mean(e2es) / scale,
        "e2e_p50_s": statistics.median(e2es) / scale,
        # usage is the engine's JSON (dict[str, object]); its token counts are numbers.
        "prompt_tokens": float(usage.get("prompt_tokens", 0)),  # type: ignore[arg-type]
        "completion_tokens": float(usage.get("completion_tokens", 0)),  # type: ignore[arg-type]
    }


def main() -> None:
    """Print the simulator's figures beside the Spark's."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=7)
    parser.add_argument(
        "--arrivals-per-min",
        type=float,
        default=None,
        help="open loop: Poisson arrivals at this rate instead of a closed loop",
    )
    args = parser.parse_args()
    figures = asyncio.run(run(args.time_scale, args.requests, args.concurrency, args.arrivals_per_min))
    load = (
        f"Poisson arrivals at {args.arrivals_per_min:g}/min"
        if args.arrivals_per_min
        else f"{args.concurrency} clients in a closed loop"
    )
    print(
        f"simulator spark preset, {args.requests} requests, {load}, "
        f"time scale {args.time_scale:g} (figures scaled back to the Spark's pace)"
    )
    print(
        f"request shape: {figures['prompt_tokens']:.0f} prompt tokens, "
        f"{figures['completion_tokens']:.0f} completion tokens (last request)"
    )
    print(f"{'figure':<22}{'Spark (measured)':>18}{'simulator':>12}{'ratio':>8}")
    for label, spark, sim in (
        ("requests/min", SPARK["requests_per_min"], figures["requests_per_min"]),
        ("TTFT mean (s)", SPARK["ttft_s"], figures["ttft_mean_s"]),
        ("end to end mean (s)", SPARK["e2e_s"], figures["e2e_mean_s"]),
    ):
        print(f"{label:<22}{spark:>18.3f}{sim:>12.3f}{sim / spark:>8.2f}")
    print(f"TTFT p50 {figures['ttft_p50_s']:.3f} s, end to end p50 {figures['e2e_p50_s']:.3f} s")
    print(
        "note: the Spark averaged ~6.7 requests in flight (Little's law: 0.78 req/s x 8.56 s), hence"
        " the default of 7 clients. Throughput barely moves with concurrency (a prefill stalls the whole"
        " batch); TTFT and end to end do."
    )


if __name__ == "__main__":
    main()
