"""The weekly report at fleet scale: wall time and peak memory of `modgate quality report` on one week.

    python -m bench.quality_report --pairs 1000000                 # Parquet partition, today's report
    python -m bench.quality_report --pairs 250000 --format jsonl   # the gateway's JSONL file
    python -m bench.quality_report --pairs 250000 --format jsonl --code /path/to/older/checkout

Generates the week's records column by column (:mod:`bench.quality_week`: random shadow pairs with
everything around them), writes them as the chosen store holds them, then runs the report command in a
child process (the `--code` checkout's, when given) and prints its wall time, its peak resident memory
(the child's own, from `getrusage`) and the machine's load average, which every figure must carry on a
shared machine. One run per call: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.quality_week import week_table, write_jsonl, write_parquet


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def _own_peak_mb() -> float:
    """This process's peak resident memory (the generator's, when it ran here)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# The child reports its own peak: getrusage's figure for children also counts the parent's pages the
# child held between fork and exec, which here are the generated records.
_CHILD = (
    "import atexit, sys\n"
    "def peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            print('child-peak-kb', line.split()[1], file=sys.stderr)\n"
    "atexit.register(peak)\n"
    "from gateway.cli.main import main\n"
    "main()\n"
)


def run_report(code: Path, records: Path, out: Path, *, bootstrap: int) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in MB, exit code) of one `modgate quality report` in a child
    process. CPU seconds (user + system) say what the work costs whatever else shares the machine."""
    command = [
        sys.executable,
        "-c",
        _CHILD,
        "quality",
        "report",
        "--week",
        "2026-W48",
        "--records",
        str(records),
        "--out",
        str(out),
        "--trend-weeks",
        "0",
        "--bootstrap",
        str(bootstrap),
    ]
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=code, env=env, check=False, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    peaks = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("child-peak-kb")]
    peak_mb = peaks[-1] / 1024 if peaks else float("nan")
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
    else:
        print(done.stderr.strip().splitlines()[0] if done.stderr.strip() else "", file=sys.stderr)
    return seconds, cpu, peak_mb, done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--keep", type=Path, default=None, help="write the records here and keep them")
    parser.add_argument("--records", type=Path, default=None, help="report on records already written here")
    parser.add_argument("--reports", type=Path, default=None, help="write the report files here, kept")
    parser.add_argument(
        "--chunk",
        type=int,
        default=1_000_000,
        help="generate at most this many pairs at a time (Parquet only): the generator's memory",
    )
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="modgate-quality-bench-"))
    records = args.keep or work / "records"
    try:
        started = time.perf_counter()
        if args.records is not None:
            records, written = args.records, -1
        elif args.format == "jsonl":
            written = write_jsonl(week_table(args.pairs), records / "records-2026-W48.jsonl")
        else:
            written = 0
            for part, first in enumerate(range(0, args.pairs, args.chunk)):
                # each slice its own videos and frames: one week made of independent fleets' pairs
                table = week_table(
                    min(args.chunk, args.pairs - first), seed=48 + part, video_prefix=f"video-{part}-"
                )
                write_parquet(table, records)
                written += table.num_rows
                del table
        size_mb = sum(p.stat().st_size for p in records.rglob("*") if p.is_file()) / 1e6
        print(
            f"generated {args.pairs:,} pairs: {written:,} records, {size_mb:,.0f} MB of {args.format} "
            f"in {time.perf_counter() - started:.1f} s, peak RSS {_own_peak_mb():,.0f} MB ({_load()})"
        )
        seconds, cpu, peak_mb, code = run_report(
            args.code, records, args.reports or work / "reports", bootstrap=args.bootstrap
        )
        print(
            f"report: {args.pairs:,} pairs ({args.format}, code {args.code}): {seconds:.1f} s wall, "
            f"{cpu:.1f} s CPU, peak RSS {peak_mb:,.0f} MB, exit {code} ({_load()})"
        )
        return code
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
