"""The simulator's Spark preset against the Spark's measurements: the fit, and rows it never saw.

The fit: the preset's two rates (prefill and decode tokens per second) were chosen so that the seed's final,
tuned configuration reproduces its three figures (46.7 requests/min, mean TTFT 0.468 s, mean end to end
8.56 s; end to end follows from the rate by Little's law, so two constants meet two independent figures):
goodness of fit, not validation. ``--refit`` searches those two constants again.

Held out: the seed's rows the fit never saw, predicted from the mechanism alone (its parameters are the
flags' values and the Spark's measured draft acceptance, never adjusted to these rows): MTP speculative
decoding on (4 drafted, 39.9 % accepted), and the fork's prefill cap (``--max-num-prefill-tokens-per-step
256 --prefill-compute-share 0.2``).

Every row runs the seed's request shape (1,076 prompt tokens, ~95 output, thinking on) with 7 callers in
a closed loop (the Spark averaged 6.7 in flight: 0.78 requests/s × 8.56 s) on the step model's virtual
clock (``deploy.simulator.virtual``): deterministic, the same on a loaded machine as on a quiet one.
``--paced`` also runs the served simulator over HTTP at ``--time-scale`` (its tokenizer's request shape,
the machine's noise) for the fit's configuration, asking for the verdict of ``--verdict-format`` (its
system prompt and output constraint). By default that is the seed's JSON verdict, as in the capacity
bench's calibration check: the figures compared are the seed's, and the compact verdict (the gateway's
default) ends a thinking-on answer ~20 tokens sooner, which is this round's gain, not the preset's fit.

    python -m bench.calibration [--json FILE] [--refit]
                                [--paced [--time-scale 0.25] [--requests 96] [--verdict-format json]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import calibration_cpu
from bench.calibration_cpu import CHUNKED, FIT, THRESHOLD
from bench.servers import simulator
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, SimPreset
from deploy.simulator.virtual import LoadFigures, closed_loop
from shaping.image import ImageLimits, ShapedImage, shape_image
from shaping.prompt import RequestOptions, build_chat_request, load_system_prompt, prompt_version_for
from shaping.tokens import TokenGrid
from shaping.verdict import VERDICT_FORMATS, VerdictFormat

SPARK = {"requests_per_min": 46.7, "ttft_s": 0.468, "e2e_s": 8.56}
SEED_VERDICT_FORMAT: VerdictFormat = "json"  # what the seed's requests asked for when it measured SPARK
CALLERS = 7  # the Spark's ~6.7 in flight


@dataclass(frozen=True)
class SeedFigure:
    """A figure the seed measured: a value, or a range (then ``value`` is its middle)."""

    value: float
    low: float | None = None
    high: float | None = None

    @classmethod
    def span(cls, low: float, high: float) -> SeedFigure:
        return cls((low + high) / 2, low, high)


@dataclass(frozen=True)
class Row:
    """One compared figure: ``name`` the configuration, ``figure`` what is measured."""

    name: str
    figure: str
    seed: SeedFigure
    simulated: float

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "engine": "spark",
            "name": self.name,
            "figure": self.figure,
            "seed": self.seed.value,
            "simulated": self.simulated,
            "ratio": self.simulated / self.seed.value,
        }
        if self.seed.low is not None:
            row["seed_range"] = [self.seed.low, self.seed.high]
        return row


MTP = {"num_speculative_tokens": 4}  # --speculative-config {"method":"mtp","num_speculative_tokens":4}
PREFILL_CAP = {"max_num_prefill_tokens_per_step": 256, "prefill_compute_share": 0.2}


def tables(preset: SimPreset, callers: int = CALLERS) -> dict[str, list[Row]]:
    """The fit's rows and the held-out rows, simulated with ``preset``."""
    tuned = closed_loop(preset, callers)
    mtp = closed_loop(preset.scaled(**MTP), callers)
    capped = closed_loop(preset.scaled(**PREFILL_CAP), callers)
    tuned_name = "tuned (the fit)"
    fit = [
        Row(tuned_name, "requests/min", SeedFigure(SPARK["requests_per_min"]), tuned.requests_per_min),
        Row(tuned_name, "TTFT mean (s)", SeedFigure(SPARK["ttft_s"]), tuned.ttft_mean_s),
        Row(tuned_name, "end to end mean (s)", SeedFigure(SPARK["e2e_s"]), tuned.e2e_mean_s),
        # Not fitted, but the same configuration: rate × output tokens.
        Row(tuned_name, "generation (tokens/s)", SeedFigure.span(72.9, 86.1), tuned.generation_tokens_per_s),
    ]
    mtp_name, off_name = "MTP on (4 drafted, 39.9 % accepted)", "MTP off (that experiment's baseline)"
    cap_name = "prefill cap 256/step, compute share 0.2"
    held_out = [
        Row(mtp_name, "generation (tokens/s)", SeedFigure.span(65, 80), mtp.generation_tokens_per_s),
        Row(mtp_name, "TTFT mean (s)", SeedFigure(1.27), mtp.ttft_mean_s),
        Row(off_name, "generation (tokens/s)", SeedFigure.span(100, 104), tuned.generation_tokens_per_s),
        Row(off_name, "TTFT mean (s)", SeedFigure(0.54), tuned.ttft_mean_s),
        Row(
            mtp_name,
            "generation, on/off",
            SeedFigure.span(65 / 104, 80 / 100),
            mtp.generation_tokens_per_s / tuned.generation_tokens_per_s,
        ),
        Row(mtp_name, "TTFT, on/off", SeedFigure(1.27 / 0.54), mtp.ttft_mean_s / tuned.ttft_mean_s),
        Row(cap_name, "requests/min", SeedFigure(24.3), capped.requests_per_min),
        Row(cap_name, "TTFT mean (s)", SeedFigure(5.93), capped.ttft_mean_s),
        Row(cap_name, "generation (tokens/s)", SeedFigure.span(36.3, 59.0), capped.generation_tokens_per_s),
    ]
    return {"fit": fit, "held_out": held_out}


def refit(preset: SimPreset, callers: int = CALLERS) -> tuple[float, float, LoadFigures]:
    """The two rates that meet the seed's rate and TTFT: the decode rate follows from the rate (the engine
    is busy throughout, so 60 / rate = prefill tokens / prefill rate + decode tokens / decode rate), and
    the prefill rate is bisected until the mean TTFT is the seed's."""
    seconds_per_request = 60 / SPARK["requests_per_min"]
    prompt, decoded = 1076, 94

    reads = preset.weight_reads.seconds(prompt) if preset.weight_reads is not None else 0.0

    def with_prefill(rate: float) -> tuple[SimPreset, LoadFigures]:
        decode = decoded / (seconds_per_request - prompt / rate - reads)
        candidate = preset.scaled(prefill_tokens_per_s=rate, decode_tokens_per_s=decode)
        return candidate, closed_loop(candidate, callers)

    low, high = 2000.0, 200000.0
    for _ in range(16):
        middle = (low + high) / 2
        _, figures = with_prefill(middle)
        low, high = (middle, high) if figures.ttft_mean_s > SPARK["ttft_s"] else (low, middle)
    candidate, figures = with_prefill((low + high) / 2)
    return candidate.prefill_tokens_per_s, candidate.decode_tokens_per_s, figures


def seed_frame() -> ShapedImage:
    """The seed's image, shaped as the gateway shapes it: 1056×640 is exactly 33×20 = 660 tokens."""
    return shape_image(make_keyframe("allow", 1056, 640, seed=11), ImageLimits(), TokenGrid(token_budget=660))


# The first streamed token: reasoning, or the answer's first character (a JSON brace or a compact verdict).
_FIRST_TOKEN = re.compile(r'"(?:reasoning|content)":\s*"[^"]')


def seed_request(verdict_format: VerdictFormat = SEED_VERDICT_FORMAT) -> dict[str, Any]:
    """The seed's request (its frame, thinking on, streamed) asking for ``verdict_format``'s verdict."""
    return build_chat_request(
        load_system_prompt(prompt_version_for(verdict_format)),
        [seed_frame()],
        "请审核这张视频关键帧截图。",
        RequestOptions(
            model=PRESETS["spark"].model,
            enable_thinking=True,
            max_completion_tokens=512,
            verdict_format=verdict_format,
        ),
    )


async def run(
    time_scale: float,
    requests: int,
    concurrency: int,
    arrivals_per_min: float | None = None,
    verdict_format: VerdictFormat = SEED_VERDICT_FORMAT,
) -> dict[str, float]:
    """Closed loop at ``concurrency`` (or open loop at ``arrivals_per_min``); figures at the Spark's pace."""
    body = seed_request(verdict_format)
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
                        if first is None and _FIRST_TOKEN.search(line):
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
        "prompt_tokens": float(usage.get("prompt_tokens", 0)),  # type: ignore[arg-type]  # engine JSON: a number
        "completion_tokens": float(usage.get("completion_tokens", 0)),  # type: ignore[arg-type]  # the same
    }


def print_table(title: str, rows: list[Row]) -> None:
    """One table: configuration, figure, the seed's value (or range), the simulator's, and the ratio."""
    print(f"\n{title}")
    print(f"  {'configuration':<42}{'figure':<24}{'seed':>13}{'simulated':>11}{'ratio':>7}")
    for row in rows:
        low, high = row.seed.low, row.seed.high
        seed = f"{low:.3g}-{high:.3g}" if low is not None and high is not None else f"{row.seed.value:.3g}"
        print(
            f"  {row.name:<42}{row.figure:<24}{seed:>13}{row.simulated:>11.3f}"
            f"{row.simulated / row.seed.value:>7.2f}"
        )


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write {fit: [...], held_out: [...]} here")
    parser.add_argument("--refit", action="store_true", help="search the preset's two rates again")
    parser.add_argument("--paced", action="store_true", help="also run the served simulator over HTTP")
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=CALLERS)
    parser.add_argument(
        "--arrivals-per-min",
        type=float,
        default=None,
        help="with --paced: Poisson arrivals at this rate instead of a closed loop",
    )
    parser.add_argument(
        "--vllm-cpu",
        metavar="URL",
        help="also fit and hold out the vllm-cpu preset on the "
        "real vLLM CPU engine at URL (default flags; modgate engine-cpu)",
    )
    parser.add_argument(
        "--vllm-cpu-chunked",
        metavar="URL",
        help="with --vllm-cpu: an engine started with --max-num-batched-tokens 64",
    )
    parser.add_argument(
        "--vllm-cpu-threshold",
        metavar="URL",
        help="with --vllm-cpu: an engine started with --long-prefill-token-threshold 32",
    )
    parser.add_argument(
        "--vllm-cpu-boot",
        action="store_true",
        help="instead of URLs: boot the real vLLM CPU engines here, one at a time (the default one, then "
        "the chunking and the threshold engines in turn, the one before stopped first)",
    )
    parser.add_argument(
        "--cpu-replay",
        type=Path,
        metavar="LOG",
        help="instead of measuring: fit again the measurements a --vllm-cpu-boot run printed to LOG (at the "
        "printed precision), every engine's rows",
    )
    parser.add_argument(
        "--row-cost-probe",
        action="store_true",
        help="with --vllm-cpu or --vllm-cpu-boot: probe a sampled row's cost beside each measurement of the "
        "fit configuration (the engine's torch) and price it as the decode cost in the fits",
    )
    parser.add_argument(
        "--cpu-traces",
        type=Path,
        metavar="DIR",
        help="with --vllm-cpu-boot: save each measurement of the fit configuration's token arrivals in DIR "
        "(JSON; bench.row_cost reads the cost per row from them)",
    )
    parser.add_argument(
        "--measure-lock",
        type=Path,
        metavar="FILE",
        help="with --vllm-cpu or --vllm-cpu-boot: hold flock on FILE while measuring (not while fitting)",
    )
    parser.add_argument(
        "--vllm-cpu-flags-only",
        action="store_true",
        help="with --vllm-cpu: measure only the configurations of the engines started with other flags "
        "(each still bracketed by the fit configuration on the default engine)",
    )
    parser.add_argument(
        "--add-cpu-rows-to",
        type=Path,
        metavar="FILE",
        help="with --vllm-cpu: also add this run's vllm-cpu rows to FILE's fit and held_out tables "
        "(a second invocation's rows beside the first's; each row names its run)",
    )
    parser.add_argument(
        "--cpu-requests", type=int, default=40, help="measured requests per CPU configuration"
    )
    parser.add_argument(
        "--cpu-fit-requests",
        type=int,
        default=120,
        help="requests per virtual run inside the CPU fits (fewer: quicker fits, coarser constants)",
    )
    parser.add_argument(
        "--cpu-fit-workers",
        type=int,
        default=1,
        help="run the CPU fits (the single fit, its two variants and each row's bracketed fit) in this many "
        "processes at once, after the measuring (each fit is pure simulation on one core)",
    )
    parser.add_argument(
        "--verdict-format",
        choices=VERDICT_FORMATS,
        default=SEED_VERDICT_FORMAT,
        help="with --paced: the verdict asked for (its system prompt and output constraint); "
        "default the seed's",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Print the fit's table and the held-out table (and write both as JSON with ``--json``)."""
    args = parse_arguments(argv)
    preset = PRESETS["spark"]
    if args.refit:
        prefill, decode, figures = refit(preset, args.concurrency)
        print(
            f"refit: prefill {prefill:,.0f} tokens/s, decode {decode:.2f} tokens/s -> "
            f"{figures.requests_per_min:.2f}/min, TTFT {figures.ttft_mean_s:.3f} s, "
            f"end to end {figures.e2e_mean_s:.2f} s (preset: {preset.prefill_tokens_per_s:,.0f} and "
            f"{preset.decode_tokens_per_s:g})"
        )
    print(
        f"simulator spark preset: prefill {preset.prefill_tokens_per_s:,.0f} tokens/s, decode "
        f"{preset.decode_tokens_per_s:g} tokens/s; the seed's request (1,076 prompt tokens, ~95 output); "
        f"{args.concurrency} callers in a closed loop on the step model's virtual clock"
    )
    result = tables(preset, args.concurrency)
    print_table("fit (the seed's final configuration; the preset's rates were chosen on it):", result["fit"])
    print_table(
        "held out (never used to choose a constant; mechanism parameters from the flags):", result["held_out"]
    )
    document = {key: [row.as_json() for row in rows] for key, rows in result.items()}
    if args.vllm_cpu or args.vllm_cpu_boot or args.cpu_replay:
        document = with_vllm_cpu(args, document)
    if not all(math.isfinite(row["simulated"]) for rows in document.values() for row in rows):
        raise SystemExit("a simulated figure is not finite")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.paced:
        paced(args)


def with_vllm_cpu(args: argparse.Namespace, document: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Measure the real vLLM CPU engine's configurations, fit vllm-cpu on one, hold out the rest."""
    urls = {"": args.vllm_cpu}
    for flags, url in ((CHUNKED.flags, args.vllm_cpu_chunked), (THRESHOLD.flags, args.vllm_cpu_threshold)):
        if url:
            urls[flags] = url
    engines = (
        calibration_cpu.OneEngineAtATime(args.cpu_requests, 8, traces_to=args.cpu_traces)
        if args.vllm_cpu_boot
        else None
    )
    replay = calibration_cpu.Replay(args.cpu_replay.read_text()) if args.cpu_replay else None
    if engines is not None or replay is not None:
        urls = dict.fromkeys(("", CHUNKED.flags, THRESHOLD.flags), "booted here")
    try:
        preset, cpu = calibration_cpu.run(
            urls, args.cpu_requests, flags_only=args.vllm_cpu_flags_only, measure_with=engines or replay,
            fit_requests=args.cpu_fit_requests, lock=args.measure_lock,
            probe=calibration_cpu.probe_row_cost if args.row_cost_probe else None,
            workers=args.cpu_fit_workers,
        )  # fmt: skip
    finally:
        if engines is not None:
            engines.close()
    print(
        f"\nvllm-cpu preset fitted on '{FIT.name}': step {preset.step_overhead_s * 1000:.2f} ms + prefill "
        f"{preset.prefill_tokens_per_s:,.0f} tokens/s + decode {preset.decode_tokens_per_s:,.0f} tokens/s; "
        f"{preset.request_overhead_s * 1000:.2f} ms a request outside the steps"
    )
    print(f"  {'configuration':<48}{'figure':<22}{'real':>9}{'simulated':>11}{'ratio':>7}{'without':>9}"
          f"{'bracketed':>11}{'ratio':>7}{'drift':>7}{'no rows':>9}{'br. no rows':>12}")  # fmt: skip
    for table in ("fit", "held_out"):
        for row in cpu[table]:
            bracketed = (
                f"{row['bracketed_simulated']:>11.3f}{row['bracketed_ratio']:>7.2f}{row['drift']:>7.2f}"
                if "bracketed_ratio" in row
                else ""
            )
            print(
                f"  {row['name']:<48}{row['figure']:<22}{row['seed']:>9.3f}{row['simulated']:>11.3f}"
                f"{row['ratio']:>7.2f}{row['ratio_without_request_overhead']:>9.2f}{bracketed}"
                f"{optional(row, 'ratio_without_row_cost', 9)}"
                f"{optional(row, 'bracketed_ratio_without_row_cost', 12)}  ({table})"
            )
    print("  (ratio: the preset fitted on the fit configuration's first measurement; without: the same fit")
    print("  without the cost per request outside the steps; bracketed: the preset fitted on the mean of the")
    print("  fit configuration measured just before and just after the row; drift: its rate after / before;")
    print("  no rows: the single and the bracketed fits with decode free, no sampled row's cost)")
    if args.add_cpu_rows_to:
        earlier = json.loads(args.add_cpu_rows_to.read_text())
        args.add_cpu_rows_to.write_text(
            json.dumps({key: earlier[key] + cpu[key] for key in earlier}, indent=2) + "\n"
        )
    return {key: document[key] + cpu[key] for key in document}


def optional(row: dict[str, Any], key: str, width: int) -> str:
    """A ratio column a row may lack (an earlier run's rows), right-aligned; blank when missing."""
    return f"{row[key]:>{width}.2f}" if key in row else " " * width


def paced(args: argparse.Namespace) -> None:
    """The fit's configuration through the served simulator, over HTTP, at ``--time-scale``."""
    figures = asyncio.run(
        run(args.time_scale, args.requests, args.concurrency, args.arrivals_per_min, args.verdict_format)
    )
    load = (
        f"Poisson arrivals at {args.arrivals_per_min:g}/min"
        if args.arrivals_per_min
        else f"{args.concurrency} clients in a closed loop"
    )
    print(
        f"\nserved simulator (HTTP), {args.requests} requests, {load}, {args.verdict_format} verdict, "
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


if __name__ == "__main__":
    main()
