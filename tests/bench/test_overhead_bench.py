"""``bench/overhead.py`` runs end to end with tiny counts and prints its table (figures, never judged)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import overhead, plots


def _rows(printed: str) -> dict[tuple[int, str], list[str]]:
    """Table rows by (clients, arm): ``clients arm p50 p99 req/s [added p50 added p99]``."""
    rows = {}
    for line in printed.splitlines():
        match = re.match(r"\s+(\d+)\s+(engine|modgate\S*|litellm)\s+(.*)$", line)
        if match:
            rows[(int(match[1]), match[2])] = match[3].split()
    return rows


def _stub_counts(printed: str) -> tuple[int, int]:
    """The engine stub's distinct bodies and replayed answers, as the benchmark prints them."""
    found = re.search(r"engine stub: (\d+) distinct request bodies, (\d+) replayed answers", printed)
    assert found, printed
    return int(found.group(1)), int(found.group(2))


def test_the_overhead_benchmark_prints_every_arm_at_every_concurrency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "overhead.json"
    overhead.main(["--requests", "6", "--rounds", "2", "--concurrency", "1", "3", "--arms", "modgate",
                   "--variant", "json-logs", "MODGATE_TELEMETRY__JSON_LOGS=true", "--json", str(report)])
    printed = capsys.readouterr().out
    rows = _rows(printed)
    assert set(rows) == {(c, arm) for c in (1, 3) for arm in ("engine", "modgate", "modgate:json-logs")}
    for (_, arm), cells in rows.items():
        assert len(cells) == 5  # p50, p99, req/s, added p50, added p99 (a dash for the engine itself)
        figures = cells[:3] if arm == "engine" else cells
        assert all(float(cell) == float(cell) for cell in figures)  # numbers, not NaN
        assert (cells[3:] == ["-", "-"]) == (arm == "engine")
    # a handful of distinct bodies (the engine arm's, modgate's, start-up checks'), each replayed: the stub
    # answers from its recordings instead of running the simulator for every timed request
    distinct, replays = _stub_counts(printed)
    assert 2 <= distinct <= 4
    assert replays >= 6 * 2 * 3 - distinct
    saved = json.loads(report.read_text())
    assert set(saved["results"]) == {"1", "3"}
    assert saved["results"]["1"]["arms"]["modgate"]["added_p50_ms"] == pytest.approx(
        saved["results"]["1"]["arms"]["modgate"]["p50_ms"] - saved["results"]["1"]["arms"]["engine"]["p50_ms"]
    )
    assert plots.plot_overhead(saved, tmp_path).read_bytes().startswith(b"\x89PNG")


def test_the_overhead_benchmark_runs_litellm_beside_modgate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first run on a machine installs LiteLLM into ${MODGATE_BENCH_HOME:-~/.cache/modgate} (minutes).
    overhead.main(["--requests", "4", "--rounds", "1", "--concurrency", "2"])
    printed = capsys.readouterr().out
    assert set(_rows(printed)) == {(2, "engine"), (2, "modgate"), (2, "litellm")}
    assert re.search(r"modgate/litellm: added p50 \S+x, added p99 \S+x, req/s \S+x", printed)
    distinct, replays = _stub_counts(printed)  # LiteLLM forwards its own rewrite of the body: one more
    assert 3 <= distinct <= 5
    assert replays >= 4 * 3 - distinct


def test_the_overhead_benchmark_measures_modgate_with_worker_processes(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    overhead.main(["--requests", "6", "--rounds", "1", "--concurrency", "2", "--arms", "modgate",
                   "--workers", "2", "--redis-url", redis_url, "--markdown"])
    printed = capsys.readouterr().out
    assert set(_rows(printed)) == {(2, "engine"), (2, "modgate"), (2, "modgate:workers-2")}
    assert "| clients | modgate req/s (÷ LiteLLM) | modgate:workers-2 req/s (÷ LiteLLM) |" in printed


def test_worker_arms_without_redis_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        overhead.main(["--workers", "2", "--redis-url", ""])
    assert "--workers needs --redis-url" in capsys.readouterr().err
