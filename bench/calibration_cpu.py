"""The step model held to the real vLLM: the ``vllm-cpu`` preset fitted on one configuration, held out.

Each configuration is measured on the real vLLM CPU engine (the tiny model, Qwen's BPE) and simulated by
the same step law on the virtual clock (``deploy.simulator.virtual``), in one run so both see the same
machine. The preset's two constants (a step's fixed cost and the prefill rate) are fitted on ONE
configuration only, :data:`FIT`: 4 in flight, default flags, thinking on, prompts that share nothing.
Every other row is a prediction the fit never saw: the in-flight cap at 1, 2 and 8; thinking off (its
template, a 4-token answer); the same prompt repeated (the prefix cache serves whole 128-token blocks);
and, on engines started with other flags, ``--max-num-batched-tokens`` small enough to chunk every
prefill and ``--long-prefill-token-threshold``.

Requests are text only (the canonical system prompt, a unique first line so nothing is shared unless asked,
the user's instruction), with ``min_tokens`` = ``max_completion_tokens`` so the random model's answer has
the planned length. A row's ``seed`` is the real engine's figure (``engine: "vllm-cpu"``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from deploy.simulator import PRESETS, SimPreset
from deploy.simulator.virtual import RequestShape, closed_loop
from shaping.prompt import load_system_prompt

THINKING_ON_TOKENS = 64  # reasoning, as a thinking-on answer spends it
THINKING_OFF_TOKENS = 4  # a compact verdict and its stop token
INSTRUCTION = "请审核这张视频关键帧截图。"


@dataclass(frozen=True, slots=True)
class Configuration:
    """One measured configuration: callers, thinking, repeated prompts, and which engine (by its flags)."""

    name: str
    callers: int
    thinking: bool = True
    repeated: bool = False
    flags: str = ""  # the engine's extra flags ("" = the default engine)
    changes: tuple[tuple[str, Any], ...] = ()  # the same flags as preset fields

    @property
    def output_tokens(self) -> int:
        return THINKING_ON_TOKENS if self.thinking else THINKING_OFF_TOKENS


FIT = Configuration("4 in flight, thinking on (the fit)", 4)
HELD_OUT = (
    Configuration("1 in flight", 1),
    Configuration("2 in flight", 2),
    Configuration("8 in flight", 8),
    Configuration("4 in flight, thinking off", 4, thinking=False),
    Configuration("4 in flight, the same prompt repeated", 4, repeated=True),
)
CHUNKED = Configuration(
    "4 in flight, --max-num-batched-tokens 64", 4, flags="--max-num-batched-tokens 64",
    changes=(("max_num_batched_tokens", 64),),
)  # fmt: skip
THRESHOLD = Configuration(
    "4 in flight, --long-prefill-token-threshold 32", 4, flags="--long-prefill-token-threshold 32",
    changes=(("long_prefill_token_threshold", 32),),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Measured:
    """What a closed loop on the real engine measured."""

    requests_per_min: float
    ttft_mean_s: float
    e2e_mean_s: float
    prompt_tokens: int
    cached_tokens: float


def _body(config: Configuration, index: int) -> dict[str, Any]:
    system = load_system_prompt().text
    first = "" if config.repeated else f"request {index} at {time.time_ns()}\n"
    return {
        "model": "tiny",
        "messages": [{"role": "system", "content": first + system}, {"role": "user", "content": INSTRUCTION}],
        "chat_template_kwargs": {"enable_thinking": config.thinking},
        "max_completion_tokens": config.output_tokens,
        "min_tokens": config.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def measure(url: str, config: Configuration, requests: int, warmup: int) -> Measured:
    """``config.callers`` callers in a closed loop on the real engine; figures over the measured requests."""
    issued = 0
    rows: list[tuple[int, float, float, float, int, int]] = []  # index, start, first, end, prompt, cached

    async def caller(http: httpx.AsyncClient, stagger_s: float) -> None:
        nonlocal issued
        await asyncio.sleep(stagger_s)
        while issued < warmup + requests:
            index = issued
            issued += 1
            started = time.monotonic()
            first, usage = None, {}
            async with http.stream("POST", "/v1/chat/completions", json=_body(config, index)) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line.endswith("[DONE]"):
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    if first is None and chunk["choices"]:
                        delta = chunk["choices"][0]["delta"]
                        if delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content"):
                            first = time.monotonic()
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            rows.append((index, started, first or time.monotonic(), time.monotonic(),
                         int(usage.get("prompt_tokens", 0)), int(cached)))  # fmt: skip

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await asyncio.gather(*(caller(http, i * 0.05) for i in range(config.callers)))
    measured = [row for row in rows if row[0] >= warmup]
    start, end = min(row[1] for row in measured), max(row[3] for row in measured)
    window = [row for row in rows if start < row[3] <= end]
    return Measured(
        requests_per_min=len(window) / (end - start) * 60,
        ttft_mean_s=statistics.fmean(row[2] - row[1] for row in measured),
        e2e_mean_s=statistics.fmean(row[3] - row[1] for row in measured),
        prompt_tokens=round(statistics.fmean(row[4] for row in measured)),
        cached_tokens=statistics.fmean(row[5] for row in measured),
    )


def simulate(preset: SimPreset, config: Configuration, prompt_tokens: int, requests: int = 120) -> Measured:
    """The same configuration on the step model's virtual clock."""
    shape = RequestShape(
        prompt_tokens=prompt_tokens,
        output_tokens=config.output_tokens,
        output_jitter=0,
        shared_prefix_tokens=prompt_tokens if config.repeated else 0,
    )
    chosen = preset.scaled(**dict(config.changes)) if config.changes else preset
    figures = closed_loop(
        chosen, config.callers, shape=shape, requests=requests, warmup=20, turnaround_s=0.002
    )
    return Measured(figures.requests_per_min, figures.ttft_mean_s, figures.e2e_mean_s, prompt_tokens, 0.0)


FIGURES: tuple[tuple[str, Callable[[Measured], float]], ...] = (
    ("requests/min", lambda m: m.requests_per_min),
    ("TTFT mean (s)", lambda m: m.ttft_mean_s),
    ("end to end mean (s)", lambda m: m.e2e_mean_s),
)


def fit(
    measured: Measured, config: Configuration = FIT, row_s: float = 0.0, requests: int = 120
) -> SimPreset:
    """The two constants (a step's fixed cost and the prefill rate) that meet the fit configuration's
    end to end and TTFT; the rate follows from them by Little's law. A decode token costs ``row_s`` when
    one is known from elsewhere; by default 0, free: the fit configuration's batch is always 4, so its
    figures cannot tell a per-sequence cost from the fixed one (docs/simulator.md: what that misses).

    Nested bisection on log scales, as the Spark's refit: for a prefill rate, the fixed cost that meets the
    end to end (it grows with the cost); then the prefill rate that meets the TTFT (it falls as the rate
    grows). The virtual clock's figures step with whole steps, so a gradient search stalls on them."""
    base = replace(PRESETS["vllm-cpu"], decode_tokens_per_s=1 / row_s if row_s > 0 else 0.0)

    def bisect(low: float, high: float, too_high: Callable[[float], bool]) -> float:
        for _ in range(14):  # a factor of 1e5 cut to 0.07 %
            middle = math.sqrt(low * high)
            low, high = (low, middle) if too_high(middle) else (middle, high)
        return math.sqrt(low * high)

    def with_rate(prefill: float) -> SimPreset:
        def slow(overhead: float) -> bool:
            candidate = replace(base, step_overhead_s=overhead, prefill_tokens_per_s=prefill)
            figures = simulate(candidate, config, measured.prompt_tokens, requests)
            return figures.e2e_mean_s > measured.e2e_mean_s

        return replace(base, step_overhead_s=bisect(1e-5, 1.0, slow), prefill_tokens_per_s=prefill)

    def fast_first_token(prefill: float) -> bool:  # too high a rate: the TTFT comes out below the measured
        figures = simulate(with_rate(prefill), config, measured.prompt_tokens, requests)
        return figures.ttft_mean_s < measured.ttft_mean_s

    return with_rate(bisect(100.0, 1e7, fast_first_token))


def rows_of(config: Configuration, real: Measured, simulated: Measured) -> list[dict[str, Any]]:
    """The compared figures of one configuration, as calibration rows (``seed``: the real engine's)."""
    return [
        {"engine": "vllm-cpu", "name": config.name, "figure": figure, "seed": get(real),
         "simulated": get(simulated), "ratio": get(simulated) / get(real)}
        for figure, get in FIGURES
    ]  # fmt: skip


def machine_load() -> str:
    """The 1, 5 and 15 minute load averages, printed with every figure."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores"


def run(
    urls: dict[str, str], requests: int = 40, warmup: int = 8
) -> tuple[SimPreset, dict[str, list[Any]]]:
    """Measure every configuration whose engine is in ``urls`` (flags → URL), fit on :data:`FIT`, compare."""
    configs = [FIT, *HELD_OUT, CHUNKED, THRESHOLD]
    measured: dict[str, tuple[Measured, str]] = {}
    for config in configs:
        url = urls.get(config.flags)
        if url is None:
            continue
        began = machine_load()
        figures = asyncio.run(measure(url, config, requests, warmup))
        measured[config.name] = (figures, f"{began} -> {machine_load()}")
        print(f"measured {config.name}: {figures.requests_per_min:.1f}/min, "
              f"TTFT {figures.ttft_mean_s:.3f} s, "
              f"end to end {figures.e2e_mean_s:.3f} s, {figures.prompt_tokens} prompt tokens "
              f"({figures.cached_tokens:.0f} cached); {measured[config.name][1]}", flush=True)  # fmt: skip
    # The machine is shared: the fit configuration again at the end shows how far its speed drifted.
    again = asyncio.run(measure(urls[FIT.flags], FIT, requests, warmup))
    first = measured[FIT.name][0]
    drift = again.requests_per_min / first.requests_per_min
    print(f"the fit configuration again at the end: {again.requests_per_min:.1f}/min ({drift:.2f} of the "
          f"first), TTFT {again.ttft_mean_s:.3f} s, end to end {again.e2e_mean_s:.3f} s; {machine_load()}",
          flush=True)  # fmt: skip
    preset = fit(first)
    return preset, compare(preset, configs, measured)


def compare(
    preset: SimPreset, configs: list[Configuration], measured: dict[str, tuple[Measured, str]]
) -> dict[str, list[Any]]:
    """Every measured configuration simulated with ``preset``: the fit's rows and the held-out rows."""
    document: dict[str, list[Any]] = {"fit": [], "held_out": []}
    for config in configs:
        if config.name not in measured:
            continue
        real, load = measured[config.name]
        rows = rows_of(config, real, simulate(preset, config, real.prompt_tokens))
        for row in rows:
            row["load"] = load
        document["fit" if config is FIT else "held_out"] += rows
    return document
