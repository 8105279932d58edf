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
import contextlib
import fcntl
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.row_cost import StreamTrace, identify, identify_by_requests
from bench.row_cost import save as save_traces
from deploy.engine_cpu import boot_engine, default_model_dir, default_venv_dir, venv_python
from deploy.engine_launch import EngineProcess
from deploy.simulator import PRESETS, SimPreset
from deploy.simulator.virtual import RequestShape, alone_e2e_s, closed_loop
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
    # Measured requests per the run's count: thinking off's 40 took 5 s, a moment of the machine's drift.
    requests_factor: int = 1
    # Seconds between the callers' first requests (in the warm-up): the fit configuration's are a request's
    # length apart, so its warm-up decodes at 1, 2 and 3 rows before 4 (bench.row_cost reads the steps).
    stagger_s: float = 0.05

    @property
    def output_tokens(self) -> int:
        return THINKING_ON_TOKENS if self.thinking else THINKING_OFF_TOKENS


FIT = Configuration("4 in flight, thinking on (the fit)", 4, stagger_s=0.5)
HELD_OUT = (
    Configuration("1 in flight", 1),
    Configuration("2 in flight", 2),
    Configuration("8 in flight", 8),
    Configuration("4 in flight, thinking off", 4, thinking=False, requests_factor=4),
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


# vLLM's per-request histograms (v1/metrics/loggers.py), each a request's time in one phase: waiting in the
# engine's queue, scheduled until its first token (prefill), running (prefill and decode), and the
# front end's own arrival-to-finish and arrival-to-first-token.
ENGINE_HISTOGRAMS: Final = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
    "front_end_e2e": "vllm:e2e_request_latency_seconds",
    "front_end_ttft": "vllm:time_to_first_token_seconds",
}


@dataclass(frozen=True, slots=True)
class EngineTimes:
    """Mean seconds a request spent in each of vLLM's phases (its /metrics histograms, one run's share)."""

    requests: int
    queue_s: float
    prefill_s: float
    inference_s: float
    front_end_e2e_s: float
    front_end_ttft_s: float

    @property
    def first_token_s(self) -> float:
        """The engine's own time to a first token: queued, then scheduled until it is sampled."""
        return self.queue_s + self.prefill_s

    @property
    def e2e_s(self) -> float:
        """The engine's own time for a request: queued, then running until its last token."""
        return self.queue_s + self.inference_s


@dataclass(frozen=True, slots=True)
class Measured:
    """What a closed loop on the real engine measured."""

    requests_per_min: float
    ttft_mean_s: float
    e2e_mean_s: float
    prompt_tokens: int
    cached_tokens: float
    # Every request of the run (the warm-up too, as the engine's histograms count them): the client's
    # mean TTFT and end to end, and the engine's own times (None: not read, as for a simulated run).
    ttft_all_s: float = 0.0
    e2e_all_s: float = 0.0
    engine: EngineTimes | None = None
    step_wait_s: float = 0.0  # simulated only: the mean wait, at the engine, for the step in progress
    # A sequence's cost in a step: identified from this run's step times (bench.row_cost; the fit
    # configuration's), or probed from the hardware beside it (--row-cost-probe); 0: neither.
    row_s: float = 0.0
    row_standard_error_s: float = 0.0

    @property
    def outside_first_token_s(self) -> float | None:
        """The client's TTFT less the engine's queue and prefill: time outside the engine's steps."""
        return None if self.engine is None else self.ttft_all_s - self.engine.first_token_s

    @property
    def outside_e2e_s(self) -> float | None:
        """The client's end to end less the engine's queue and running time: outside the engine's steps."""
        return None if self.engine is None else self.e2e_all_s - self.engine.e2e_s


def histogram_totals(text: str) -> dict[str, tuple[float, float]]:
    """Each of :data:`ENGINE_HISTOGRAMS` as (sum, count) over its label sets, from /metrics' text."""
    totals = {name: [0.0, 0.0] for name in ENGINE_HISTOGRAMS.values()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for suffix, slot in (("_sum", 0), ("_count", 1)):
                name = sample.name.removesuffix(suffix)
                if sample.name.endswith(suffix) and name in totals:
                    totals[name][slot] += sample.value
    return {name: (total, count) for name, (total, count) in totals.items()}


def engine_times(before: str, after: str) -> EngineTimes:
    """The engine's mean phase times over the requests that ended between two /metrics readings."""
    start, end = histogram_totals(before), histogram_totals(after)

    def mean(key: str) -> float:
        name = ENGINE_HISTOGRAMS[key]
        count = end[name][1] - start[name][1]
        if count <= 0:
            raise RuntimeError(f"{name}: no requests between the two readings of /metrics")
        return (end[name][0] - start[name][0]) / count

    requests = end[ENGINE_HISTOGRAMS["inference"]][1] - start[ENGINE_HISTOGRAMS["inference"]][1]
    return EngineTimes(round(requests), *(mean(key) for key in ENGINE_HISTOGRAMS))


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
        # usage on every chunk too: the completion tokens counted so far time each step (bench.row_cost)
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


async def measure(
    url: str, config: Configuration, requests: int, warmup: int, traces_to: Path | None = None
) -> Measured:
    """``config.callers`` callers in a closed loop on the real engine; figures over the measured requests.
    Each token's arrival is kept; the fit configuration's give its row cost (:func:`bench.row_cost.identify`
    over every request, the warm-up's ramp too), and are saved in the folder ``traces_to`` if given."""
    issued = 0
    rows: list[tuple[int, float, float, float, int, int]] = []  # index, start, first, end, prompt, cached
    traces: list[StreamTrace] = []

    async def caller(http: httpx.AsyncClient, stagger_s: float) -> None:
        nonlocal issued
        await asyncio.sleep(stagger_s)
        while issued < warmup + requests:
            index = issued
            issued += 1
            started = time.monotonic()
            first, usage = None, {}
            arrivals: list[tuple[float, int]] = []  # (arrival, completion tokens so far)
            async with http.stream("POST", "/v1/chat/completions", json=_body(config, index)) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line.endswith("[DONE]"):
                        continue
                    now = time.monotonic()
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                        tokens = int(usage.get("completion_tokens") or 0)
                        if chunk["choices"] and tokens > (arrivals[-1][1] if arrivals else 0):
                            arrivals.append((now, tokens))
                    if first is None and chunk["choices"]:
                        delta = chunk["choices"][0]["delta"]
                        if delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content"):
                            first = now
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            rows.append((index, started, first or time.monotonic(), time.monotonic(),
                         int(usage.get("prompt_tokens", 0)), int(cached)))  # fmt: skip
            traces.append(StreamTrace(started, tuple(arrivals)))

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        before = (await http.get("/metrics")).text
        await asyncio.gather(*(caller(http, i * config.stagger_s) for i in range(config.callers)))
        after = (await http.get("/metrics")).text
    measured = [row for row in rows if row[0] >= warmup]
    start, end = min(row[1] for row in measured), max(row[3] for row in measured)
    window = [row for row in rows if start < row[3] <= end]
    steps = identify(traces) if config is FIT else None
    if steps is not None:
        print(f"  {steps.describe()}", flush=True)
    if config is FIT and (whole := identify_by_requests(traces)) is not None:  # the cross-check, not used
        print(f"  {whole.describe()}", flush=True)
    if config is FIT and traces_to is not None:
        saved = traces_to / time.strftime("fit-%Y%m%dT%H%M%SZ.json", time.gmtime())
        save_traces(traces, saved)  # after the loop: nothing is left to time
        print(f"  its token arrivals: {saved}", flush=True)
    return Measured(
        requests_per_min=len(window) / (end - start) * 60,
        ttft_mean_s=statistics.fmean(row[2] - row[1] for row in measured),
        e2e_mean_s=statistics.fmean(row[3] - row[1] for row in measured),
        prompt_tokens=round(statistics.fmean(row[4] for row in measured)),
        cached_tokens=statistics.fmean(row[5] for row in measured),
        ttft_all_s=statistics.fmean(row[2] - row[1] for row in rows),
        e2e_all_s=statistics.fmean(row[3] - row[1] for row in rows),
        engine=engine_times(before, after),
        row_s=max(0.0, steps.row_s) if steps else 0.0,
        row_standard_error_s=steps.row_standard_error_s if steps else 0.0,
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
    # the callers' starts spread over a request's own length (not the Spark's 8.56 s: thinking off's
    # 50 ms requests would end the warm-up before the fourth caller starts)
    figures = closed_loop(
        chosen, config.callers, shape=shape, requests=requests, warmup=20, turnaround_s=0.002,
        spread_s=alone_e2e_s(chosen, shape),
    )  # fmt: skip
    return Measured(figures.requests_per_min, figures.ttft_mean_s, figures.e2e_mean_s, prompt_tokens, 0.0,
                    step_wait_s=figures.step_wait_mean_s)  # fmt: skip


FIGURES: tuple[tuple[str, Callable[[Measured], float]], ...] = (
    ("requests/min", lambda m: m.requests_per_min),
    ("TTFT mean (s)", lambda m: m.ttft_mean_s),
    ("end to end mean (s)", lambda m: m.e2e_mean_s),
)


TTFT_TOLERANCE = 0.02  # a fit whose TTFT is further off than this share sits at a jump: search the range
GRID_POINTS = 10


def fit(
    measured: Measured,
    config: Configuration = FIT,
    row_s: float = 0.0,
    requests: int = 120,
    request_s: float = 0.0,
    near: SimPreset | None = None,
) -> SimPreset:
    """The two constants (a step's fixed cost and the prefill rate) that meet the fit configuration's
    end to end and TTFT; the rate follows from them by Little's law. A sequence in a step costs ``row_s``
    (``SimPreset.row_cost_s``) when it is known from elsewhere: the fit configuration's step times
    (:mod:`bench.row_cost`) or the hardware probe; its means alone cannot tell a per-sequence cost from the
    fixed one, since its batch is nearly always 4 (docs/engineering.md). By default 0.
    ``request_s`` is the cost per request outside the engine's steps (``SimPreset.request_overhead_s``),
    measured, not fitted (:func:`outside_the_steps`): the two constants price what is left.

    Nested bisection on log scales, as the Spark's refit: for a prefill rate, the fixed cost that meets the
    end to end (it grows with the cost); then the prefill rate that meets the TTFT (it falls as the rate
    grows). The virtual clock's figures step with whole steps, so a gradient search stalls on them.
    ``near``: a fit of nearly the same figures (the fixed point's previous attempt); both searches then
    start within a factor of 4 of its constants, in 9 halvings rather than 14, and fall back to the whole
    range when a constant comes out at the edge."""
    base = replace(
        PRESETS["vllm-cpu"], decode_tokens_per_s=0.0, row_cost_s=max(0.0, row_s), request_overhead_s=request_s
    )

    def bisect(low: float, high: float, too_high: Callable[[float], bool]) -> float:
        for _ in range(14 if near is None else 9):  # a factor of 1e5 (or 16) cut to 0.07 % (0.5 %)
            middle = math.sqrt(low * high)
            low, high = (low, middle) if too_high(middle) else (middle, high)
        return math.sqrt(low * high)

    def closest_crossing(low: float, high: float, found: SimPreset) -> SimPreset:
        # The bisection stopped at a jump of the TTFT (the closed loop's phase against the steps: it is
        # not monotone in the rate), not at a crossing. Every crossing on a grid of the range is bisected
        # instead, and the one whose TTFT comes out closest is kept.
        grid = [low * (high / low) ** (k / GRID_POINTS) for k in range(GRID_POINTS + 1)]
        slow = [not fast_first_token(rate) for rate in grid]
        best, best_off = found, abs(first_token_off(found))
        for k in range(GRID_POINTS):
            if slow[k] and not slow[k + 1]:
                candidate = with_rate(bisect(grid[k], grid[k + 1], fast_first_token))
                if (off := abs(first_token_off(candidate))) < best_off:
                    best, best_off = candidate, off
        return best

    def around(value: float, low: float, high: float) -> tuple[float, float]:
        return (value / 4, value * 4) if near is not None else (low, high)

    def with_rate(prefill: float) -> SimPreset:
        def slow(overhead: float) -> bool:
            candidate = replace(base, step_overhead_s=overhead, prefill_tokens_per_s=prefill)
            figures = simulate(candidate, config, measured.prompt_tokens, requests)
            return figures.e2e_mean_s > measured.e2e_mean_s

        overhead = bisect(*around(near.step_overhead_s if near else 0.0, 1e-5, 1.0), slow)
        return replace(base, step_overhead_s=overhead, prefill_tokens_per_s=prefill)

    def first_token_off(preset: SimPreset) -> float:  # > 0: the TTFT comes out above the measured
        return simulate(preset, config, measured.prompt_tokens, requests).ttft_mean_s - measured.ttft_mean_s

    def fast_first_token(prefill: float) -> bool:  # too high a rate: the TTFT comes out below the measured
        return first_token_off(with_rate(prefill)) < 0

    low_rate, high_rate = around(near.prefill_tokens_per_s if near else 0.0, 100.0, 1e7)
    fitted = with_rate(bisect(low_rate, high_rate, fast_first_token))
    if (
        low_rate * 1.01 < fitted.prefill_tokens_per_s < high_rate / 1.01
        and abs(first_token_off(fitted)) > TTFT_TOLERANCE * measured.ttft_mean_s
    ):
        fitted = closest_crossing(low_rate, high_rate, fitted)
    if near is not None and any(
        min(value / start, start / value) < 0.26
        for value, start in ((fitted.step_overhead_s, near.step_overhead_s),
                             (fitted.prefill_tokens_per_s, near.prefill_tokens_per_s))
    ):  # fmt: skip
        return fit(measured, config, row_s, requests, request_s)
    return fitted


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


# One sampled row's work on the tiny model, as vLLM's CPU step does it per running sequence: the LM head
# (the tied 151,936 x 128 embedding, float32) over the row's hidden state, the min_tokens processor's stop
# ids masked, softmax, and vLLM's random sampler (``probs / Exponential(1)`` then argmax,
# v1/sample/ops/topk_topp_sampler.py). The transformer's two 128-wide layers are left out (a row's share is
# ~0.1 % of the head's multiply-adds). Timed at 1, 2, 4 and 8 rows, interleaved so the machine's drift
# falls on every batch size alike; the slope of the medians is the cost per row.
ROW_PROBE: Final = """
import json, statistics, sys, time, torch
vocab, hidden, threads, rounds = (int(arg) for arg in sys.argv[1:])
torch.set_num_threads(threads)
weight = torch.randn(vocab, hidden)
def sample(rows):
    logits = torch.nn.functional.linear(torch.randn(rows, hidden), weight)
    logits[:, :2] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    return probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)
times = {rows: [] for rows in (1, 2, 4, 8)}
for _ in range(rounds):
    for rows in times:
        began = time.perf_counter(); sample(rows); times[rows].append(time.perf_counter() - began)
print(json.dumps({rows: statistics.median(seen) for rows, seen in times.items()}))
"""


def probe_row_cost(python: Path | None = None, model_dir: Path | None = None, rounds: int = 20) -> float:
    """Seconds one more sampled row adds to a step on this machine now (:data:`ROW_PROBE`, run by the
    engine's own torch), the least-squares slope over the batch sizes; the model's sizes from its config."""
    config = json.loads(((model_dir or default_model_dir()) / "config.json").read_text())["text_config"]
    command = [str(python or venv_python(default_venv_dir())), "-c", ROW_PROBE, str(config["vocab_size"]),
               str(config["hidden_size"]), str(os.cpu_count() or 1), str(rounds)]  # fmt: skip
    answer = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    medians = {int(rows): seconds for rows, seconds in json.loads(answer.stdout).items()}
    mean_rows, mean_s = statistics.fmean(medians), statistics.fmean(medians.values())
    slope = sum((rows - mean_rows) * (s - mean_s) for rows, s in medians.items()) / sum(
        (rows - mean_rows) ** 2 for rows in medians
    )
    return max(0.0, float(slope))


AFTER_BOOT = Configuration("after a boot, not measured", 8)
AFTER_BOOT_REQUESTS = 16

Measure = Callable[[str, Configuration], Measured]
"""One configuration measured on the engine at a URL (by default :func:`measure`'s closed loop)."""


class OneEngineAtATime:
    """Engines booted here (``modgate engine-cpu``'s), one at a time: the engine a configuration's flags
    name is started when it is needed, the one before stopped first, so the shared machine never holds
    two. A restart costs the engine its prefix cache and its first slow steps: a booted engine first serves
    :data:`AFTER_BOOT` (not measured), so that the fit configuration's staggered start, which reads the step
    at 1, 2 and 3 rows, does not fall on them. Call it as a :data:`Measure` (the URL is ignored); ``close``
    at the end."""

    def __init__(
        self,
        requests: int,
        warmup: int,
        boot: Callable[[str], EngineProcess] | None = None,
        traces_to: Path | None = None,
    ) -> None:
        """Measure ``requests`` (times a configuration's factor) after ``warmup``; boot with ``boot``; save
        the fit configuration's token arrivals in the folder ``traces_to``."""
        self.requests, self.warmup, self.traces_to = requests, warmup, traces_to
        if traces_to is not None:
            traces_to.mkdir(parents=True, exist_ok=True)
        self.boot = boot or self._boot_and_warm_up
        self.engine: EngineProcess | None = None
        self.flags = ""

    @staticmethod
    def _boot_and_warm_up(flags: str) -> EngineProcess:
        engine = boot_engine(extra_args=shlex.split(flags), ready_timeout=1500)[0]
        asyncio.run(measure(engine.url, AFTER_BOOT, AFTER_BOOT_REQUESTS, 0))
        return engine

    def __call__(self, url: str, config: Configuration) -> Measured:
        """Measure ``config`` on an engine started with its flags (booted now if another one runs)."""
        if self.engine is None or self.flags != config.flags:
            self.close()
            began = time.monotonic()
            self.engine, self.flags = self.boot(config.flags), config.flags
            print(f"booted the engine with flags '{config.flags}' in {time.monotonic() - began:.0f} s; "
                  f"{machine_load()}", flush=True)  # fmt: skip
        requests = self.requests * config.requests_factor
        return asyncio.run(measure(self.engine.url, config, requests, self.warmup, self.traces_to))

    def close(self) -> None:
        """Stop the engine running, if any."""
        if self.engine is not None:
            self.engine.stop()
            self.engine = None


_MEASURED = re.compile(
    r"^measured (?P<name>.+?): (?P<rate>[\d.]+)/min, TTFT (?P<ttft>[\d.]+) s, end to end (?P<e2e>[\d.]+) s, "
    r"(?P<prompt>\d+) prompt tokens \((?P<cached>[\d.]+) cached\); (?P<load>.*)$"
)
_PHASES = re.compile(
    r"^  (?P<requests>\d+) requests by the engine's histograms: queue (?P<queue>[\d.]+) ms, prefill "
    r"(?P<prefill>[\d.]+) ms, running (?P<running>[\d.]+) ms; the client's TTFT (?P<ttft>[\d.]+) ms, end to "
    r"end (?P<e2e>[\d.]+) ms;.*front end: TTFT (?P<front_ttft>[\d.]+) ms, end to end (?P<front_e2e>[\d.]+) ms"
)

_ROW_COST = re.compile(r"^  a row's cost from the step times: (?P<row>-?[\d.]+) ± (?P<error>[\d.]+) ms")


def replayed(log: str) -> list[tuple[str, Measured, str]]:
    """A run's measurements read back from what it printed (``measured ...`` and the histograms' line
    after it), in order: the figures at the printed precision (a TTFT to the millisecond, the engine's
    phases to 0.1 ms; a row's cost, printed before its measurement's line, to the microsecond). For
    fitting a run again with another law or fit without measuring it again."""
    seen: list[tuple[str, Measured, str]] = []
    row_s, error_s = 0.0, 0.0
    for line in log.splitlines():
        if found := _ROW_COST.match(line):  # a probed cost (--row-cost-probe) is not read back: decode free
            row_s, error_s = max(0.0, float(found["row"]) / 1000), float(found["error"]) / 1000
        elif found := _MEASURED.match(line):
            figures = Measured(float(found["rate"]), float(found["ttft"]), float(found["e2e"]),
                               int(found["prompt"]), float(found["cached"]), row_s=row_s,
                               row_standard_error_s=error_s)  # fmt: skip
            seen.append((found["name"], figures, found["load"]))
            row_s, error_s = 0.0, 0.0
        elif (found := _PHASES.match(line)) and seen:
            ms = {key: float(value) / 1000 for key, value in found.groupdict().items() if key != "requests"}
            engine = EngineTimes(int(found["requests"]), ms["queue"], ms["prefill"], ms["running"],
                                 ms["front_e2e"], ms["front_ttft"])  # fmt: skip
            name, figures, load = seen[-1]
            figures = replace(figures, ttft_all_s=ms["ttft"], e2e_all_s=ms["e2e"], engine=engine)
            seen[-1] = (name, figures, load)
    return seen


class Replay:
    """A :data:`Measure` that hands back a printed run's measurements (:func:`replayed`) in its order."""

    def __init__(self, log: str) -> None:
        """Read the run's log."""
        self.seen = replayed(log)
        self.load = ""  # the machine's load while the measurement handed back last was taken

    def __call__(self, url: str, config: Configuration) -> Measured:
        """The next measurement, which must be ``config``'s."""
        name, figures, self.load = self.seen.pop(0)
        if name != config.name:
            raise ValueError(f"the log measured {name!r} where the run asks for {config.name!r}")
        return figures


@contextlib.contextmanager
def measurement_lock(path: Path | None) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (the shared machine's measurement lock, as ``flock(1)`` takes it) while
    measuring, so no other session's timing overlaps; the fits after need no lock. None: no lock."""
    if path is None:
        yield
        return
    with path.open("a") as handle:
        print(f"waiting for the measurement lock {path}; {machine_load()}", flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
        print(f"measurement lock taken; {machine_load()}", flush=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            print(f"measurement lock released; {machine_load()}", flush=True)


def run(
    urls: dict[str, str],
    requests: int = 40,
    warmup: int = 8,
    *,
    flags_only: bool = False,
    measure_with: Measure | None = None,
    fit_requests: int = 120,
    held_out: Sequence[Configuration] = (*HELD_OUT, CHUNKED, THRESHOLD),
    lock: Path | None = None,
    probe: Callable[[], float] | None = None,
    workers: int = 1,
) -> tuple[SimPreset, dict[str, list[Any]]]:
    """Measure every configuration whose engine is in ``urls`` (flags → URL), fit on :data:`FIT`, compare.

    The machine is shared and its speed drifts within a run, so the fit configuration is measured before
    the first held-out configuration and again after each one: every held-out row sits between two
    measurements of the fit configuration. Each row is compared twice: with the preset fitted on the
    first measurement (``simulated``, ``ratio``: the single fit), and with the preset fitted on the mean of
    its two neighbouring measurements (``bracketed_simulated``, ``bracketed_ratio``; ``drift`` is the fit
    configuration's rate after the row over its rate before). ``flags_only`` measures only the engines
    started with other flags (their rows still bracketed on the default engine): the second invocation
    when at most two engines fit in memory. ``lock``: the file whose ``flock`` is held while measuring.
    ``probe``: a sampled row's cost (:func:`probe_row_cost`), probed after each measurement of the fit
    configuration and priced as the decode cost in its fits (``ratio_without_row_cost`` and
    ``bracketed_ratio_without_row_cost``: the same fits with decode free). ``workers``: processes the fits
    run in at once once the measuring is done (each is pure simulation on one core)."""
    measure_with = measure_with or (
        lambda url, config: asyncio.run(measure(url, config, requests * config.requests_factor, warmup))
    )
    held_out = [c for c in held_out if c.flags in urls and (c.flags or not flags_only)]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def take(config: Configuration) -> tuple[Measured, str]:
        began = machine_load()
        figures = measure_with(urls[config.flags], config)
        if probe is not None and config is FIT:
            figures = replace(figures, row_s=probe())
            print(f"  a sampled row's cost, probed: {figures.row_s * 1000:.2f} ms", flush=True)
        load = measure_with.load if isinstance(measure_with, Replay) else f"{began} -> {machine_load()}"
        print(f"measured {config.name}: {figures.requests_per_min:.1f}/min, "
              f"TTFT {figures.ttft_mean_s:.3f} s, "
              f"end to end {figures.e2e_mean_s:.3f} s, {figures.prompt_tokens} prompt tokens "
              f"({figures.cached_tokens:.0f} cached); {load}", flush=True)  # fmt: skip
        print(f"  {phases(figures)}", flush=True)
        return figures, load

    with measurement_lock(lock):
        fits = [take(FIT)]
        measured = {FIT.name: fits[0]}
        for config in held_out:
            measured[config.name] = take(config)
            fits.append(take(FIT))
            print(f"  drift across {config.name}: the fit configuration ran at "
                  f"{fits[-1][0].requests_per_min / fits[-2][0].requests_per_min:.2f} of its speed before",
                  flush=True)  # fmt: skip
        if isinstance(measure_with, OneEngineAtATime):
            measure_with.close()
    first = fits[0][0]
    with _fitting(workers) as pool:
        single = pool.submit(fit_with_request_overhead, first, requests=fit_requests, row_s=first.row_s)
        # The same rows from the law without the cost outside the steps, fitted on the same measurement:
        # what the per-request cost changed; and with no cost per row, as the law was before it.
        plain = pool.submit(fit, first, row_s=first.row_s, requests=fit_requests)
        free_fit = (
            pool.submit(fit_with_request_overhead, first, requests=fit_requests) if first.row_s > 0 else None
        )
        brackets = [
            pool.submit(bracketed, config, measured[config.name][0], fits[index][0], fits[index + 1][0],
                        fit_requests)
            for index, config in enumerate(held_out)
        ]  # fmt: skip
        preset = single.result()
        residual = outside_residual(preset, first, requests=fit_requests)
        print(f"fit: {preset.request_overhead_s * 1000:.2f} ms a request outside the steps, the fixed "
              f"point's residual {residual * 1000:.2f} ms", flush=True)  # fmt: skip
        document = compare(preset, [FIT, *held_out], measured)
        without = compare(plain.result(), [FIT, *held_out], measured)
        no_rows = compare(free_fit.result() if free_fit is not None else preset, [FIT, *held_out], measured)
        bracket_rows = [future.result() for future in brackets]
    for table in document:
        for row, before, free_row in zip(document[table], without[table], no_rows[table], strict=True):
            row["ratio_without_request_overhead"] = before["ratio"]
            row["ratio_without_row_cost"] = free_row["ratio"]
            row["run"] = started
    for config, (_, figures) in zip(held_out, bracket_rows, strict=True):
        _add_bracketed(document, config, figures)
    return preset, document


@contextlib.contextmanager
def _fitting(workers: int) -> Iterator[Executor]:
    """Where the fits run: ``workers`` processes (each fit is pure simulation on one core), or this one."""
    if workers <= 1:
        with _Here() as here:
            yield here
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield pool


class _Here(Executor):
    """An executor that runs each call at once, in this process (``--cpu-fit-workers 1``)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def bracket(
    document: dict[str, list[Any]],
    config: Configuration,
    real: Measured,
    before: Measured,
    after: Measured,
    fit_requests: int = 120,
) -> SimPreset:
    """Add to ``config``'s held-out rows the comparison with the preset fitted on the mean of the fit
    configuration's measurements just before and just after it, at the speed the row itself saw."""
    preset, figures = bracketed(config, real, before, after, fit_requests)
    _add_bracketed(document, config, figures)
    return preset


def bracketed(
    config: Configuration, real: Measured, before: Measured, after: Measured, fit_requests: int = 120
) -> tuple[SimPreset, list[dict[str, Any]]]:
    """The preset fitted on the mean of the fit configuration's measurements either side of ``config``,
    and what each of ``config``'s held-out rows gains from it (in :data:`FIGURES`' order)."""
    seen = mean_of(before, after)
    preset = fit_with_request_overhead(seen, requests=fit_requests, row_s=seen.row_s)
    simulated = simulate(preset, config, real.prompt_tokens)
    free = fit_with_request_overhead(seen, requests=fit_requests) if seen.row_s > 0 else preset
    simulated_free = simulate(free, config, real.prompt_tokens)
    constants = {"step_overhead_s": preset.step_overhead_s,
                 "prefill_tokens_per_s": preset.prefill_tokens_per_s,
                 "request_overhead_s": preset.request_overhead_s,
                 "row_s": seen.row_s}  # fmt: skip
    figures = [
        {"figure": figure,
         "bracketed_simulated": get(simulated),
         "bracketed_ratio": get(simulated) / get(real),
         "bracketed_ratio_without_row_cost": get(simulated_free) / get(real),
         "drift": after.requests_per_min / before.requests_per_min,
         "fit_before": get(before), "fit_after": get(after),
         "bracketed_fit": constants}
        for figure, get in FIGURES
    ]  # fmt: skip
    return preset, figures


def _add_bracketed(
    document: dict[str, list[Any]], config: Configuration, figures: list[dict[str, Any]]
) -> None:
    """``config``'s held-out rows with their bracketed comparison (:func:`bracketed`)."""
    rows = [row for row in document["held_out"] if row["name"] == config.name]
    for row, gained in zip(rows, figures, strict=True):
        assert row["figure"] == gained["figure"]
        row.update({key: value for key, value in gained.items() if key != "figure"})


Timed = TypeVar("Timed", Measured, EngineTimes)


def mean_of(first: Timed, second: Timed) -> Timed:
    """Two measurements of one configuration as one: the mean of each figure (the engine's phase times
    too; a count's mean rounded)."""
    values: dict[str, Any] = {}
    for field in fields(first):
        one, other = getattr(first, field.name), getattr(second, field.name)
        if isinstance(one, EngineTimes) and isinstance(other, EngineTimes):
            values[field.name] = mean_of(one, other)
        elif one is None or other is None:
            values[field.name] = None
        elif isinstance(one, int):
            values[field.name] = round((one + other) / 2)
        else:
            values[field.name] = (one + other) / 2
    return replace(first, **values)


def outside_the_steps(measured: Measured) -> float:
    """The time a request spends outside the engine's steps, from vLLM's own histograms: the mean of the
    client's TTFT less the engine's queue and prefill and the client's end to end less the engine's
    queue and running time, over the same requests. vLLM's engine core takes a new request only between
    steps (``EngineCore._process_input_queue``) and starts its queue time there, so this includes the
    wait for the step in progress."""
    first, whole = measured.outside_first_token_s, measured.outside_e2e_s
    if first is None or whole is None:
        raise ValueError("the engine's phase times were not read")
    return max(0.0, (first + whole) / 2)


def fit_with_request_overhead(
    measured: Measured,
    config: Configuration = FIT,
    requests: int = 120,
    row_s: float = 0.0,
    tolerance_s: float = 0.0005,
) -> SimPreset:
    """:func:`fit` with the cost per request outside the steps taken from the engine's histograms: the
    time outside the steps (:func:`outside_the_steps`) less the wait for the step in progress, which the
    law charges itself (``LoadFigures.step_wait_mean_s``). The wait depends on the fitted step, so the
    cost is found as a fixed point: the ``r`` whose own fit simulates a wait of ``outside - r``, within
    ``tolerance_s``. The law's wait is not smooth in its constants (the closed loop's phase against the
    steps), so iterating ``r = outside - wait(fit(r))`` can cycle; ``r`` is bisected on ``[0, outside]``
    by the residual's sign instead, and the candidate with the smallest residual is kept."""
    outside = outside_the_steps(measured)

    first: SimPreset | None = None

    def attempt(request_s: float) -> tuple[SimPreset, float]:
        preset = fit(measured, config, row_s=row_s, requests=requests, request_s=request_s, near=first)
        return preset, outside_residual(preset, measured, config, requests)  # > 0: time left unpriced

    low, high = 0.0, outside
    best, residual = attempt(outside)  # a wait of 0 would make this exact (no step to wait for)
    first = best
    while abs(residual) > tolerance_s and high - low > tolerance_s / 4:
        middle = (low + high) / 2
        candidate, off = attempt(middle)
        if abs(off) < abs(residual):
            best, residual = candidate, off
        low, high = (middle, high) if off > 0 else (low, middle)
    return best


def outside_residual(
    preset: SimPreset, measured: Measured, config: Configuration = FIT, requests: int = 120
) -> float:
    """The measured time outside the steps less the law's own (its cost per request and its simulated
    wait for the step in progress): 0 at :func:`fit_with_request_overhead`'s fixed point."""
    wait = simulate(preset, config, measured.prompt_tokens, requests).step_wait_s
    return outside_the_steps(measured) - wait - preset.request_overhead_s


def phases(measured: Measured) -> str:
    """One line: where a request's time went, by the engine's histograms against the client."""
    engine = measured.engine
    if engine is None:
        return "(the engine's phase times were not read)"
    first = measured.ttft_all_s - engine.first_token_s
    whole = measured.e2e_all_s - engine.e2e_s
    return (f"{engine.requests} requests by the engine's histograms: queue {engine.queue_s * 1000:.1f} ms, "
            f"prefill {engine.prefill_s * 1000:.1f} ms, running {engine.inference_s * 1000:.1f} ms; the "
            f"client's TTFT {measured.ttft_all_s * 1000:.1f} ms, end to end {measured.e2e_all_s * 1000:.1f} "
            f"ms; outside the steps: {first * 1000:.1f} ms to the first token, {whole * 1000:.1f} ms to the "
            f"end (vLLM's front end: TTFT {engine.front_end_ttft_s * 1000:.1f} ms, end to end "
            f"{engine.front_end_e2e_s * 1000:.1f} ms)")  # fmt: skip


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
        if real.engine is not None:  # where the real request's time went (vLLM's histograms)
            rows[1]["engine_s"], rows[1]["outside_s"] = real.engine.first_token_s, real.outside_first_token_s
            rows[2]["engine_s"], rows[2]["outside_s"] = real.engine.e2e_s, real.outside_e2e_s
        document["fit" if config is FIT else "held_out"] += rows
    return document
