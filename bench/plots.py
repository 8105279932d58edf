"""PNG plots of latency against load, from the JSON the benchmarks write (``--json``).

    python -m bench.plots [--overhead docs/bench/overhead.json] [--capacity docs/bench/capacity-compact.json]
                          [--shaping docs/bench/shaping.json] [--out docs/bench]

- ``overhead.png``: added latency (p50 and p99) over the engine against concurrent clients, per gateway,
  and requests per second;
- ``<capacity report's name>.png`` (``capacity-compact.png``): end to end p95 and TTFT p95 against offered
  keyframes per minute, per configuration, with the 3 s objective;
- ``shaping.png``: keyframes per minute per shaping option, measured and the cost model's bound, and the
  engine time per keyframe the cost model charges (prefill and decode).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI

import matplotlib.pyplot as plt

DOCS = Path("docs/bench")


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def plot_overhead(report: dict[str, Any], out: Path) -> Path:
    """Added latency and throughput against concurrency, one line per gateway."""
    results = report["results"]
    clients = sorted(int(c) for c in results)
    arms = [arm for arm, row in results[str(clients[0])]["arms"].items() if "added_p50_ms" in row]
    engines = [arm for arm, row in results[str(clients[0])]["arms"].items() if "added_p50_ms" not in row]
    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm in arms:
        for key, style in (("added_p50_ms", "-o"), ("added_p99_ms", "--^")):
            values = [results[str(c)]["arms"][arm][key] for c in clients]
            latency.plot(clients, values, style, label=f"{arm} {key.split('_')[1]}")
    latency.set(xscale="log", yscale="log", xlabel="concurrent clients (closed loop)",
                ylabel="added latency over the engine (ms)", title="Gateway overhead")
    latency.set_xticks(clients, [str(c) for c in clients])
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize=8)
    for arm in [*engines, *arms]:
        throughput.plot(clients, [results[str(c)]["arms"][arm]["rps"] for c in clients], "-o", label=arm)
    throughput.set(xscale="log", yscale="log", xlabel="concurrent clients (closed loop)",
                   ylabel="requests per second", title="Throughput (one keyframe per request)")
    throughput.set_xticks(clients, [str(c) for c in clients])
    throughput.grid(True, which="both", alpha=0.3)
    throughput.legend(fontsize=8)
    setup = report["setup"]
    fig.suptitle(f"engine {setup['engine']}, {setup['cpus']} CPUs, load average "
                 f"{setup['load_before'][0]:.1f} at start; LiteLLM {setup['litellm']}", fontsize=9)
    fig.tight_layout()
    path = out / "overhead.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_capacity(report: dict[str, Any], out: Path, name: str = "capacity.png") -> Path:
    """End to end p95 and TTFT p95 against offered keyframes per minute, one line per configuration."""
    fig, (e2e, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for row in report["configurations"]:
        points = [p for p in row["points"] if _finite(p["e2e_p95_s"])]
        rates = [p["offered_per_min"] for p in points]
        e2e.plot(rates, [p["e2e_p95_s"] for p in points], "-o", markersize=3, label=row["name"])
        ttft_points = [p for p in points if _finite(p["ttft_p95_s"])]
        ttft.plot([p["offered_per_min"] for p in ttft_points], [p["ttft_p95_s"] for p in ttft_points], "-o",
                  markersize=3, label=row["name"])
    slo = report["setup"]["slo_p95_s"]
    e2e.axhline(slo, color="grey", linestyle=":", label=f"{slo:g} s objective")
    e2e.set(yscale="log", xlabel="offered keyframes per minute (Poisson)", ylabel="end to end p95 (s)",
            title="End to end against load")
    ttft.set(yscale="log", xlabel="offered keyframes per minute (Poisson)", ylabel="TTFT p95 (s)",
             title="Time to first token against load")
    for axes in (e2e, ttft):
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7)
    setup = report["setup"]
    fig.suptitle(f"simulated Spark (time scale {setup['time_scale']:g}), {setup['cpus']} CPUs, load average "
                 f"{setup['load_before'][0]:.1f} at start", fontsize=9)
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_shaping(report: dict[str, Any], out: Path) -> Path:
    """Keyframes per minute per shaping option (measured, and the cost model's bound), and the engine time
    per keyframe the cost model charges for the measured tokens, split into prefill and decode."""
    rows = list(reversed(report["rows"]))  # the seed on top
    names = [row["name"] for row in rows]
    places = list(range(len(rows)))
    fig, (rate, cost) = plt.subplots(1, 2, figsize=(12, 0.42 * len(rows) + 1.8), sharey=True)
    height = 0.38
    measured = [row["keyframes_per_min"] for row in rows]
    bound = [row["model_bound_per_min"] if _finite(row["model_bound_per_min"]) else 0 for row in rows]
    rate.barh([p + height / 2 for p in places], measured, height, label="measured")
    rate.barh([p - height / 2 for p in places], bound, height, label="cost model bound", alpha=0.55)
    for place, value in zip(places, measured, strict=True):
        rate.text(value, place + height / 2, f" {value:,.0f}", va="center", fontsize=7)
    rate.set_yticks(places, names, fontsize=8)
    rate.set(xlabel="keyframes per minute (closed loop, Spark pace)", title="Throughput per shaping option")
    rate.grid(True, axis="x", alpha=0.3)
    rate.legend(fontsize=8, loc="upper right")
    prefill = [row["engine_prefill_s_per_frame"] if _finite(row["engine_prefill_s_per_frame"]) else 0
               for row in rows]
    decode = [row["engine_decode_s_per_frame"] if _finite(row["engine_decode_s_per_frame"]) else 0
              for row in rows]
    cost.barh(places, prefill, label="prefill (uncached prompt tokens)")
    cost.barh(places, decode, left=prefill, label="decode (output tokens)")
    cost.set(xlabel="engine seconds per keyframe (cost model, measured tokens)",
             title="Where the engine's time goes")
    cost.grid(True, axis="x", alpha=0.3)
    cost.legend(fontsize=8, loc="lower right")
    setup = report["setup"]
    fig.suptitle(
        f"simulated Spark (prefill {setup['prefill_tokens_per_s']:,.0f} / decode "
        f"{setup['decode_tokens_per_s']:g} tokens/s, time scale {setup['time_scale']:g}), "
        f"{setup['verdict_format']} verdict, {setup['clients']} clients; {setup['cpus']} CPUs, load average "
        f"{setup['load_before'][0]:.1f} at start, {setup['load_after'][0]:.1f} at the end",
        fontsize=9,
    )
    fig.tight_layout()
    path = out / "shaping.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    """Write the plots for whichever reports exist."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overhead", type=Path, default=DOCS / "overhead.json")
    parser.add_argument("--capacity", type=Path, default=DOCS / "capacity-compact.json")
    parser.add_argument("--shaping", type=Path, default=DOCS / "shaping.json")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    if args.overhead.exists():
        written.append(plot_overhead(json.loads(args.overhead.read_text()), args.out))
    if args.capacity.exists():
        report = json.loads(args.capacity.read_text())
        written.append(plot_capacity(report, args.out, f"{args.capacity.stem}.png"))
    if args.shaping.exists():
        written.append(plot_shaping(json.loads(args.shaping.read_text()), args.out))
    if not written:
        raise SystemExit(f"no report found: run bench.overhead, bench.capacity or bench.shaping with --json "
                         f"first ({args.overhead}, {args.capacity}, {args.shaping})")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
