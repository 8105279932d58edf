"""The weekly report at fleet scale: wall time and peak memory of `modgate quality report` on one week.

    python -m bench.quality_report --pairs 1000000                 # Parquet partition, today's report
    python -m bench.quality_report --pairs 250000 --format jsonl   # the gateway's JSONL file
    python -m bench.quality_report --pairs 250000 --format jsonl --code /path/to/older/checkout

Generates the week's records column by column (:mod:`bench.quality_week`: random shadow pairs with
everything around them), writes them as the chosen store holds them, then runs the report command in a
child process (the `--code` checkout's, when given) and prints its wall time, its CPU time and the peak
memory of its whole process tree at once (the report may start processes of its own: a pod's memory limit
counts them all), sampled every 50 ms from /proc: the sum of the tree's resident memory (an upper bound:
pages the processes share count in each) and of its proportional set size (shared pages split among
them, what a cgroup charges once); with the report process's own `VmHWM`, and the machine's load
average, which every figure must carry on a shared machine. One run per call: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
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
    "from cli.main import main\n"
    "main()\n"
)


def _tree(root: int) -> list[int]:
    """`root` and every process under it, from each process's parent in /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as stat:
                # the parent id is the second field after the command name, which may hold spaces
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _memory_kb(pid: int) -> tuple[int, int]:
    """(resident, proportional) set size of one process in kB; zeros once it has gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


@dataclass
class TreePeak:
    """The most the process tree under `root` held at once, sampled every `interval` seconds."""

    root: int
    interval: float = 0.05
    timeline: Path | None = None  # a line per sample: seconds, then each process's id and RSS in kB
    rss_kb: int = 0
    pss_kb: int = 0
    processes: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        started = time.perf_counter()
        log = self.timeline.open("w", encoding="ascii") if self.timeline else None
        while not self._stop.is_set():
            pids = _tree(self.root)
            sizes = [_memory_kb(pid) for pid in pids]
            self.rss_kb = max(self.rss_kb, sum(rss for rss, _ in sizes))
            self.pss_kb = max(self.pss_kb, sum(pss for _, pss in sizes))
            self.processes = max(self.processes, sum(1 for rss, _ in sizes if rss))
            if log is not None:
                each = " ".join(f"{pid}:{rss}" for pid, (rss, _) in zip(pids, sizes, strict=True))
                log.write(f"{time.perf_counter() - started:.2f} {each}\n")
            self._stop.wait(self.interval)
        if log is not None:
            log.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu: float  # user + system of the report and every process it waited for
    own_peak_mb: float  # the report process's own VmHWM
    tree: TreePeak
    exit_code: int


def run_report(code: Path, records: Path, out: Path, *, bootstrap: int, timeline: Path | None = None) -> Run:
    """One `modgate quality report` in a child process: wall and CPU seconds, the report process's own
    peak and its process tree's. CPU seconds (user + system) say what the work costs whatever else
    shares the machine."""
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
    child = subprocess.Popen(
        command, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    tree = TreePeak(child.pid, timeline=timeline)
    _, stderr = child.communicate()
    seconds = time.perf_counter() - started
    tree.stop()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peaks = [int(line.split()[1]) for line in stderr.splitlines() if line.startswith("child-peak-kb")]
    if child.returncode:
        print(stderr[-3000:], file=sys.stderr)
    elif stderr.strip():
        print(stderr.strip().splitlines()[0], file=sys.stderr)
    return Run(
        seconds=seconds,
        cpu=usage.ru_utime + usage.ru_stime,
        own_peak_mb=peaks[-1] / 1024 if peaks else float("nan"),
        tree=tree,
        exit_code=child.returncode,
    )


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
    parser.add_argument(
        "--timeline", type=Path, default=None, help="write each 50 ms sample's RSS per process here"
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
        load_before = _load()
        run = run_report(
            args.code,
            records,
            args.reports or work / "reports",
            bootstrap=args.bootstrap,
            timeline=args.timeline,
        )
        tree = run.tree
        print(
            f"report: {args.pairs:,} pairs ({args.format}, code {args.code}): {run.seconds:.1f} s wall, "
            f"{run.cpu:.1f} s CPU, peak of the process tree at once (every 50 ms, up to "
            f"{tree.processes} processes) RSS {tree.rss_kb / 1024:,.0f} MiB, PSS {tree.pss_kb / 1024:,.0f} "
            f"MiB; the report process's own VmHWM {run.own_peak_mb:,.0f} MiB; exit {run.exit_code} "
            f"(before: {load_before}; after: {_load()})"
        )
        return run.exit_code
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
