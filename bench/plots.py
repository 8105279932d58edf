"""PNG plots of latency against load, from the JSON the benchmarks write (``--json``).

    python -m bench.plots [--overhead docs/bench/overhead.json] [--capacity docs/bench/capacity.json]
                          [--out docs/bench]

- ``overhead.png``: added latency (p50 and p99) over the engine against concurrent clients, per gateway,
  and requests per second;
- ``capacity.png``: end to end p95 and TTFT p95 against offered keyframes per minute, per configuration,
  with the 3 s objective.
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
    arms = [arm for arm in results[str(clients[0])]["arms"] if arm != "engine"]
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
    for arm in ["engine", *arms]:
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


def plot_capacity(report: dict[str, Any], out: Path) -> Path:
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
    path = out / "capacity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    """Write the plots for whichever reports exist."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overhead", type=Path, default=DOCS / "overhead.json")
    parser.add_argument("--capacity", type=Path, default=DOCS / "capacity.json")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    if args.overhead.exists():
        written.append(plot_overhead(json.loads(args.overhead.read_text()), args.out))
    if args.capacity.exists():
        written.append(plot_capacity(json.loads(args.capacity.read_text()), args.out))
    if not written:
        raise SystemExit(f"no report found: run bench.overhead or bench.capacity with --json first "
                         f"({args.overhead}, {args.capacity})")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
