"""Request shaping against the engine's work per keyframe, on the simulator's Spark preset.

For the seed's request shape (one 1280×720 keyframe per request, shaped to a 660-token budget = 1088×608 =
646 image tokens, the canonical system prompt of ``--verdict-format``, compact by default, thinking on) and
each shaping option (token budget, packing
K frames per request, the block-filling prefix, thinking off), it measures:

- uncached prefill tokens per keyframe: ``prompt_tokens - cached_tokens`` from the engine's usage, / frames;
- output tokens per keyframe: ``completion_tokens`` / frames;
- keyframes per minute: a closed loop of ``--clients`` clients (twice the 8 engine slots, so the engine
  never idles) for a measured window after a warm-up, scaled back from ``--time-scale`` to the Spark's pace;
  beside it the bound the simulator's cost model gives for the measured tokens (a keyframe costs
  uncached/prefill_rate + output/decode_rate of engine time), which the measurement should approach;
- shaping cost per keyframe: ``shape_image`` (median and p99 ms, one core) on photo-like 1280×720 and
  1920×1080 JPEGs (q90) at the row's token budget.

Engine requests are built by the gateway's own request builder (``shaping.prompt.build_chat_request``, the
gateway's user texts, per-keyframe output caps and verdict constraint; the block-filling prefix with the
guidance that agrees with the verdict format) and sent straight to the simulator, so the figures are
the engine's work without the gateway's CPU in the loop (it shares the machine's two cores). The simulator
runs in a process of its own.

Time scale: every real millisecond the simulator spends on a request (parsing a 100 KB body, decoding the
JPEG to read its label, tokenizing and hashing the prompt) counts as 1/time_scale milliseconds of Spark
time. At 0.05 on a loaded two-core machine that cut the measured rates 25-35 % below the cost model (more
for K=4, whose requests carry four JPEGs); at 0.25 they land within a few per cent of it. Hence 0.25 by
default: about 13 minutes for the whole table.

    python -m bench.shaping [--time-scale 0.25] [--window-s 180] [--clients 16] [--verdict-format compact]
                            [--markdown] [--json docs/bench/shaping.json]

``--json`` writes the rows for ``python -m bench.plots`` (``shaping.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from bench.servers import simulator
from deploy.keyframes import LABELS, make_keyframe
from gateway.engine.pool_build import tool_client
from gateway.engine.prefix import EngineTokens, fill_for_format
from gateway.policy.rules import ThinkingPolicy
from gateway.settings import EngineSettings, ShapingSettings
from shaping.image import IDENTITY_SCALE, ImageLimits, ShapedImage, frame_identity, shape_image
from shaping.prompt import (
    RequestOptions,
    SystemPrompt,
    build_chat_request,
    load_system_prompt,
    prompt_version_for,
)
from shaping.tokens import TokenGrid
from shaping.verdict import DEFAULT_VERDICT_FORMAT, VERDICT_FORMATS, VerdictFormat

MODEL = "qwen3-vl-moe-sim"


@dataclass(frozen=True, slots=True)
class Option:
    """One shaping configuration: a row of the table."""

    name: str
    budget: int = 660
    packing: int = 1
    fill: bool = False
    thinking: bool = True


OPTIONS = (
    Option("seed (budget 660, K=1, no fill, thinking on)"),
    Option("budget 330", budget=330),
    Option("packing K=2", packing=2),
    Option("packing K=4", packing=4),
    Option("block-filling prefix", fill=True),
    Option("thinking off", thinking=False),
    Option("thinking off + budget 330", budget=330, thinking=False),
    Option("thinking off + budget 160", budget=160, thinking=False),
    Option("thinking off + K=4", packing=4, thinking=False),
    Option("thinking off + fill", fill=True, thinking=False),
    Option("thinking off + fill + K=4", packing=4, fill=True, thinking=False),
    Option("thinking off + fill + budget 330", budget=330, fill=True, thinking=False),
)


@dataclass
class Run:
    """What one option's measured window saw."""

    frames: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    unusable: int = 0
    elapsed_s: float = 0.0
    e2e_s: list[float] = field(default_factory=list)


def keyframes(budget: int, count: int) -> list[ShapedImage]:
    """Distinct 1280×720 keyframes (every label), shaped as the gateway shapes them at this budget."""
    grid = TokenGrid(token_budget=budget)
    return [
        shape_image(make_keyframe(LABELS[i % len(LABELS)], 1280, 720, seed=1000 + i), ImageLimits(), grid)
        for i in range(count)
    ]


def request_body(
    system: SystemPrompt,
    frames: list[ShapedImage],
    option: Option,
    verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT,
) -> dict[str, Any]:
    """The engine request the gateway builds for these frames (output cap per keyframe, times K)."""
    shaping, policy = ShapingSettings(), ThinkingPolicy()
    k = len(frames)
    text = shaping.user_text if k == 1 else shaping.packed_user_text.format(frames=k)
    cap = policy.max_completion_tokens_on if option.thinking else policy.max_completion_tokens_off
    options = RequestOptions(model=MODEL, enable_thinking=option.thinking, max_completion_tokens=cap * k,
                             stream=False, verdict_format=verdict_format)
    return build_chat_request(system, list(frames), text, options)


async def closed_loop(
    http: httpx.AsyncClient, next_body: Callable[[], dict[str, Any]], frames_per_body: int, clients: int,
    warmup_s: float, window_s: float,
) -> Run:
    """``clients`` loops posting ``next_body()`` back to back; counts what completes inside the window."""
    run = Run()
    window_start = time.monotonic() + warmup_s
    window_end = window_start + window_s

    async def client() -> None:
        while time.monotonic() < window_end:
            body = next_body()
            started = time.monotonic()
            response = await http.post("/v1/chat/completions", json=body)
            finished = time.monotonic()
            response.raise_for_status()
            if not window_start <= finished <= window_end:
                continue
            answer = response.json()
            usage = answer["usage"]
            run.requests += 1
            run.frames += frames_per_body
            run.prompt_tokens += usage["prompt_tokens"]
            run.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            run.completion_tokens += usage["completion_tokens"]
            run.unusable += answer["choices"][0]["finish_reason"] != "stop"
            run.e2e_s.append(finished - started)

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(max(0.0, window_end - time.monotonic()))
    for task in tasks:  # what is still in flight at the window's end is not counted: abort it
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    run.elapsed_s = window_s
    return run


def shaping_cost(budget: int, width: int, height: int, rounds: int) -> tuple[float, float]:
    """Median and p99 ms of ``shape_image`` for photo-like JPEGs of this size (different frames in turn)."""
    from bench.shaping_cost import photo_jpeg

    sources = [photo_jpeg(width, height, noise=6.0, seed=seed) for seed in range(8)]
    grid, limits = TokenGrid(token_budget=budget), ImageLimits()
    for data in sources:
        shape_image(data, limits, grid)  # warm-up
    times = []
    for i in range(rounds):
        started = time.perf_counter()
        shape_image(sources[i % len(sources)], limits, grid)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, round(0.99 * len(times)) - 1)]


@contextlib.contextmanager
def engine(time_scale: float) -> Iterator[str]:
    """The simulator (Spark preset) in a process of its own."""
    with simulator("spark", time_scale) as url:
        yield url


Row = tuple[Option, Run, dict[str, tuple[float, float]]]


async def measure(args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    """Every option on one simulator, one after the other; also answers the simulator's preset."""
    scale = args.time_scale
    frames_by_budget = {budget: keyframes(budget, 48) for budget in sorted({o.budget for o in OPTIONS})}
    sizes = {"1280x720": (1280, 720), "1920x1080": (1920, 1080)}
    costs = {
        budget: {size: shaping_cost(budget, *dims, args.shaping_rounds) for size, dims in sizes.items()}
        for budget in frames_by_budget
    }
    rows: list[Row] = []
    with engine(scale) as url:
        limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients * 2)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
            preset = (await http.get("/sim/info")).json()["preset"]
            verdict_format: VerdictFormat = args.verdict_format
            plain = load_system_prompt(prompt_version_for(verdict_format))
            async with tool_client(url, EngineSettings()) as counted:
                engine_tokens = await EngineTokens.connect(counted)
                filled, _ = await fill_for_format(engine_tokens, preset["block_size"], verdict_format)
            for option in OPTIONS:
                await http.post("/sim/reset_prefix_cache")  # every option starts cold and warms up
                rng = random.Random(0)

                def next_body(
                    system: SystemPrompt = filled if option.fill else plain,
                    frames: list[ShapedImage] = frames_by_budget[option.budget],
                    option: Option = option,
                    rng: random.Random = rng,
                ) -> dict[str, Any]:
                    # Frames drawn afresh for every request: no two requests share an image prefix, so only
                    # the shared system prompt can come from the cache, as in production.
                    return request_body(system, rng.sample(frames, option.packing), option, verdict_format)

                run = await closed_loop(
                    http, next_body, option.packing, args.clients,
                    warmup_s=args.warmup_s * scale, window_s=args.window_s * scale,
                )
                rows.append((option, run, costs[option.budget]))
                print(f"  measured: {option.name}", flush=True)
    return rows, preset


def figures(rows: list[Row], scale: float, preset: dict[str, Any]) -> list[dict[str, Any]]:
    """Each option's figures per keyframe at the Spark's pace: what the table prints, ``--json`` writes."""
    out: list[dict[str, Any]] = []
    for option, run, cost in rows:
        frames = run.frames or math.nan  # none finished inside the window: no figure per keyframe
        uncached = (run.prompt_tokens - run.cached_tokens) / frames
        output = run.completion_tokens / frames
        rate = run.frames / (run.elapsed_s / scale) * 60
        seed_rate = out[0]["keyframes_per_min"] if out else rate
        # The simulator charges every step its prefill tokens at one rate and one token per running sequence
        # at another: a keyframe costs uncached/prefill_rate + output/decode_rate seconds of engine time.
        prefill_s = uncached / preset["prefill_tokens_per_s"]
        decode_s = output / preset["decode_tokens_per_s"]
        out.append({
            "name": option.name, "budget": option.budget, "packing": option.packing, "fill": option.fill,
            "thinking": option.thinking, "image_tokens": smart_tokens(option.budget),
            "uncached_prefill_tokens_per_frame": uncached, "output_tokens_per_frame": output,
            "keyframes_per_min": rate, "ratio_to_seed": rate / seed_rate if seed_rate else math.nan,
            "engine_prefill_s_per_frame": prefill_s, "engine_decode_s_per_frame": decode_s,
            "model_bound_per_min": 60 / (prefill_s + decode_s) if run.frames else math.nan,
            "truncated": run.unusable,
            "requests": run.requests,
            "e2e_p50_s": statistics.median(run.e2e_s) / scale if run.e2e_s else None,
            "shaping_ms": {size: {"p50": p50, "p99": p99} for size, (p50, p99) in cost.items()},
        })
    return out


def table(rows: list[dict[str, Any]], markdown: bool) -> str:
    """One table: engine work per keyframe, throughput (measured, and the simulator's cost model), shaping."""
    head = ("option", "image tok", "uncached prefill tok/frame", "output tok/frame", "keyframes/min",
            "model bound /min", "shaping 1280x720 p50/p99 ms", "shaping 1920x1080 p50/p99 ms")
    lines = []
    for row in rows:
        truncated = f" [{row['truncated']} truncated]" if row["truncated"] else ""
        shaping = row["shaping_ms"]
        lines.append((
            row["name"],
            f"{row['image_tokens']}",
            f"{row['uncached_prefill_tokens_per_frame']:,.0f}",
            f"{row['output_tokens_per_frame']:,.1f}",
            f"{row['keyframes_per_min']:,.1f} ({row['ratio_to_seed']:.2f}x){truncated}",
            f"{row['model_bound_per_min']:,.0f}",
            "{p50:.1f} / {p99:.1f}".format(**shaping["1280x720"]),
            "{p50:.1f} / {p99:.1f}".format(**shaping["1920x1080"]),
        ))
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(head[i]), *(len(line[i]) for line in lines)) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*head), *(fmt.format(*line) for line in lines)])


def smart_tokens(budget: int) -> int:
    """Image tokens of a 1280×720 frame at this budget."""
    from shaping.tokens import image_tokens

    return image_tokens(1280, 720, TokenGrid(token_budget=budget))


def thumbnail_ms(rounds: int = 50) -> float:
    """Median ms of the verdict cache's identity (pHash + colour thumbnail) of a shaped 1088×608 frame,
    as shape_image makes it: from the frame box-reduced 8×, the reduce included."""
    shaped = shape_image(make_keyframe("allow", 1280, 720, seed=3), ImageLimits(), TokenGrid())
    with Image.open(io.BytesIO(shaped.data)) as decoded:
        pixels = decoded.convert("RGB")
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        frame_identity(pixels.reduce(IDENTITY_SCALE))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    """Measure every option and print one table (and write it as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--time-scale", type=float, default=0.25, help="simulated durations × this")
    parser.add_argument("--window-s", type=float, default=180.0, help="measured window, Spark seconds")
    parser.add_argument("--warmup-s", type=float, default=40.0, help="warm-up before it, Spark seconds")
    parser.add_argument("--clients", type=int, default=16, help="closed-loop clients (8 engine slots)")
    parser.add_argument("--shaping-rounds", type=int, default=200, help="shape_image calls per size, budget")
    parser.add_argument("--verdict-format", choices=VERDICT_FORMATS, default=DEFAULT_VERDICT_FORMAT,
                        help="the verdict asked for: its system prompt, guidance and output constraint")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", type=Path, help="write {setup, rows} here (for bench.plots)")
    args = parser.parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    print(f"simulator spark preset, time scale {args.time_scale:g} (figures scaled back to the Spark's "
          f"pace); {args.clients} clients in a closed loop; {args.window_s:g} s window after "
          f"{args.warmup_s:g} s warm-up; {args.verdict_format} verdict; {os.cpu_count()} CPUs, load average "
          f"{load_before}")
    rows, preset = asyncio.run(measure(args))
    measured = figures(rows, args.time_scale, preset)
    identity_ms = thumbnail_ms()
    load_after = [round(x, 2) for x in os.getloadavg()]
    print()
    print(table(measured, args.markdown))
    print()
    print(f"verdict-cache identity (pHash + colour thumbnail of a shaped 1088x608 frame, reduced 8x): "
          f"{identity_ms:.2f} ms")
    print(f"load average before {load_before}, after {load_after} on {os.cpu_count()} CPUs")
    if args.json:
        setup = {
            "time_scale": args.time_scale, "window_s": args.window_s, "warmup_s": args.warmup_s,
            "clients": args.clients, "verdict_format": args.verdict_format, "cpus": os.cpu_count(),
            "load_before": load_before, "load_after": load_after,
            "prefill_tokens_per_s": preset["prefill_tokens_per_s"],
            "decode_tokens_per_s": preset["decode_tokens_per_s"], "block_size": preset["block_size"],
            "identity_ms": identity_ms,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"setup": setup, "rows": measured}, indent=2) + "\n")


if __name__ == "__main__":
    main()
