"""The weekly report at fleet scale: wall time and peak memory of `modgate quality report` on one week.

    python -m bench.quality_report                                 # 250,000 then 2,500,000 pairs, Parquet
    python -m bench.quality_report --pairs 1000000                 # one size
    python -m bench.quality_report --pairs 250000 --format jsonl   # the gateway's JSONL file
    python -m bench.quality_report --pairs 250000 --format jsonl --code /path/to/older/checkout

Generates the week's records column by column (:mod:`bench.quality_week`: random shadow pairs with
everything around them), writes them as the chosen store holds them, then runs the report command in a
child process under /usr/bin/time -v (the `--code` checkout's, when given) and prints its wall time, its
CPU time, time's maximum resident set (the largest single process), the report's headline and the peak
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
    time_max_rss_mb: float  # /usr/bin/time -v: the largest resident set of any one process it waited for
    time_wall_s: float  # /usr/bin/time -v: the report's elapsed wall clock
    headline: str


TIME = "/usr/bin/time"


def _headline(stderr: str) -> str:
    """What the report command said (its title and headline), before /usr/bin/time's own lines."""
    said = stderr.split("Command being timed:", 1)[0].splitlines()
    return " ".join(line.strip() for line in said if line.strip() and not line.startswith("child-peak-kb"))


def _time_v(stderr: str) -> tuple[float, float]:
    """(maximum resident set MB, elapsed seconds) from /usr/bin/time -v's report; NaN where absent."""
    rss = wall = float("nan")
    for line in stderr.splitlines():
        text = line.strip()
        if text.startswith("Maximum resident set size (kbytes):"):
            rss = int(text.rsplit(":", 1)[1]) / 1024
        elif text.startswith("Elapsed (wall clock) time"):
            clock = text.split("):", 1)[1].strip().split(":")
            wall = sum(float(part) * 60**i for i, part in enumerate(reversed(clock)))
    return rss, wall


def run_report(code: Path, records: Path, out: Path, *, bootstrap: int, timeline: Path | None = None) -> Run:
    """One `modgate quality report` in a child process: wall and CPU seconds, the report process's own
    peak and its process tree's. CPU seconds (user + system) say what the work costs whatever else
    shares the machine."""
    command = [
        *([TIME, "-v"] if os.path.exists(TIME) else []),
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
    env = {**os.environ, "PYTHONPATH": str(code), "COLUMNS": "1000"}  # the headline on one line
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
    time_rss, time_wall = _time_v(stderr)
    return Run(
        seconds=seconds,
        cpu=usage.ru_utime + usage.ru_stime,
        own_peak_mb=peaks[-1] / 1024 if peaks else float("nan"),
        tree=tree,
        exit_code=child.returncode,
        time_max_rss_mb=time_rss,
        time_wall_s=time_wall,
        headline=_headline(stderr),
    )


# The bounds: (wall seconds, MB of /usr/bin/time's maximum resident set) for a week of this many pairs
BOUNDS = {250_000: (10.0, 500.0), 2_500_000: (60.0, 1000.0)}


def _generate(pairs: int, records: Path, fmt: str, chunk: int) -> str:
    """Write a week of `pairs` random pairs under `records`; what was written, as a line to print."""
    started = time.perf_counter()
    if fmt == "jsonl":
        written = write_jsonl(week_table(pairs), records / "records-2026-W48.jsonl")
    else:
        written = 0
        for part, first in enumerate(range(0, pairs, chunk)):
            # each slice its own videos and frames: one week made of independent fleets' pairs
            table = week_table(min(chunk, pairs - first), seed=48 + part, video_prefix=f"video-{part}-")
            write_parquet(table, records)
            written += table.num_rows
            del table
    size_mb = sum(p.stat().st_size for p in records.rglob("*") if p.is_file()) / 1e6
    return (
        f"generated {pairs:,} pairs: {written:,} records, {size_mb:,.0f} MB of {fmt} "
        f"in {time.perf_counter() - started:.1f} s, peak RSS {_own_peak_mb():,.0f} MB ({_load()})"
    )


def _verdict(pairs: int, run: Run) -> str:
    """The run against the issue's bounds for its size (none for other sizes)."""
    if pairs not in BOUNDS:
        return ""
    seconds, megabytes = BOUNDS[pairs]
    held = run.time_wall_s < seconds and run.time_max_rss_mb < megabytes
    return f"bound < {seconds:g} s and < {megabytes:g} MB: {'met' if held else 'NOT met'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, nargs="+", default=[250_000, 2_500_000])
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--keep", type=Path, default=None,
                        help="write each size's records under here (KEEP/<pairs>) and keep them")
    parser.add_argument("--records", type=Path, default=None,
                        help="report on records already written here (with one --pairs, for the label)")
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
    parser.add_argument("--markdown", type=Path, default=None, help="also write the lines printed here")
    args = parser.parse_args(argv)

    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    work = Path(tempfile.mkdtemp(prefix="modgate-quality-bench-"))
    worst = 0
    try:
        for pairs in args.pairs:
            if args.records is not None:
                records = args.records
            else:
                records = (args.keep or work) / str(pairs)
                if records.exists() and args.keep is not None:
                    say(f"{pairs:,} pairs: the records kept in {records}")
                else:
                    say(_generate(pairs, records, args.format, args.chunk))
            load_before = _load()
            run = run_report(
                args.code,
                records,
                args.reports or work / f"reports-{pairs}",
                bootstrap=args.bootstrap,
                timeline=args.timeline,
            )
            tree = run.tree
            say(
                f"report: {pairs:,} pairs ({args.format}): {run.seconds:.1f} s wall, {run.cpu:.1f} s CPU, "
                f"peak of the process tree at once (every 50 ms, up to {tree.processes} processes) RSS "
                f"{tree.rss_kb / 1024:,.0f} MiB, PSS {tree.pss_kb / 1024:,.0f} MiB; the report process's own "
                f"VmHWM {run.own_peak_mb:,.0f} MiB; /usr/bin/time -v: {run.time_wall_s:.1f} s elapsed, "
                f"maximum resident set {run.time_max_rss_mb:,.0f} MB; exit {run.exit_code} "
                f"(before: {load_before}; after: {_load()}) {_verdict(pairs, run)}"
            )
            say(f"  headline: {run.headline}")
            worst = max(worst, run.exit_code)
            if args.keep is None and args.records is None:
                shutil.rmtree(records, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.markdown is not None:
        _write_markdown(args.markdown, argv if argv is not None else sys.argv[1:], lines)
    return worst


def _write_markdown(path: Path, argv: list[str], lines: list[str]) -> None:
    """The printed lines as a docs/bench page: the command, date, machine and load first."""
    import platform
    from datetime import UTC, datetime

    command = " ".join(["python -m bench.quality_report", *argv])
    path.write_text(
        "# The weekly report at fleet scale: wall time and peak memory\n\n"
        "What `modgate quality report` takes over one generated week (`bench/quality_week.py`), against the\n"
        "bounds of a fleet's week: 250,000 pairs under 10 s and 500 MB, 2,500,000 under 60 s and 1 GB (the\n"
        "maximum resident set of /usr/bin/time -v).\n\n"
        f"- command: `{command}`\n"
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n"
        f"- machine: {platform.machine()} Linux, {os.cpu_count()} cores shared with other engineers' work, "
        f"Python {platform.python_version()}\n"
        "- load: each line below carries the load average before and after its run\n\n"
        "```text\n" + "\n".join(lines) + "\n```\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    raise SystemExit(main())
