"""``bench/overhead.py`` runs end to end with tiny counts and prints its table (figures, never judged)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from bench import engine_stub, overhead, plots


def _rows(printed: str) -> dict[tuple[int, str], list[str]]:
    """Table rows by (clients, arm): ``clients arm p50 p99 req/s [added p50 added p99]``."""
    rows = {}
    for line in printed.splitlines():
        match = re.match(r"\s+(\d+)\s+(engine\S*|modgate\S*|litellm\S*)\s+(.*)$", line)
        if match:
            rows[(int(match[1]), match[2])] = match[3].split()
    return rows


def _stub_counts(printed: str) -> tuple[int, int, int]:
    """The engine stub's distinct bodies, distinct requests and replayed answers, as the benchmark prints."""
    found = re.search(
        r"engine stub: (\d+) distinct request bodies, (\d+) distinct requests \(the gateways' own at start "
        r"included\), (\d+) replayed", printed
    )
    assert found, printed
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


def test_the_overhead_benchmark_prints_every_arm_at_every_concurrency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "overhead.json"
    overhead.main(["--requests", "6", "--rounds", "2", "--concurrency", "1", "3", "--arms", "modgate",
                   "--paths", "cheapest", "--variant", "json-logs", "MODGATE_TELEMETRY__JSON_LOGS=true",
                   "--json", str(report)])
    printed = capsys.readouterr().out
    rows = _rows(printed)
    assert set(rows) == {(c, arm) for c in (1, 3) for arm in ("engine", "modgate", "modgate:json-logs")}
    for (_, arm), cells in rows.items():
        # p50, p99, req/s, added p50, added p99, the gateway's CPU ms per request (dashes for the engine)
        assert len(cells) == 6
        figures = cells[:3] if arm == "engine" else cells
        assert all(float(cell) == float(cell) for cell in figures)  # numbers, not NaN
        assert (cells[3:] == ["-", "-", "-"]) == (arm == "engine")
    # one body: the engine arm posts the very bytes modgate sent (both modgate arms send the same), so the
    # stub records it once and replays it for every timed request
    distinct, requests, replays = _stub_counts(printed)
    assert (distinct, requests) == (1, 1)
    assert replays >= 6 * 2 * 3 - distinct
    like = ("like with like: 1 keyframe(s), 1 distinct engine requests from the first capture on: every arm "
            "asked the engine the same")
    assert like in printed
    saved = json.loads(report.read_text())
    assert set(saved["results"]) == {"1", "3"}
    assert saved["results"]["1"]["arms"]["modgate"]["cpu_ms_per_request"] > 0  # the gateway process's own
    assert saved["results"]["1"]["arms"]["modgate"]["added_p50_ms"] == pytest.approx(
        saved["results"]["1"]["arms"]["modgate"]["p50_ms"] - saved["results"]["1"]["arms"]["engine"]["p50_ms"]
    )
    assert plots.plot_overhead(saved, tmp_path).read_bytes().startswith(b"\x89PNG")


def test_the_overhead_benchmark_runs_litellm_beside_modgate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first run on a machine installs LiteLLM into ${MODGATE_BENCH_HOME:-~/.cache/modgate} (minutes).
    overhead.main(["--requests", "4", "--rounds", "1", "--concurrency", "2", "--paths", "cheapest"])
    printed = capsys.readouterr().out
    assert set(_rows(printed)) == {(2, "engine"), (2, "modgate"), (2, "litellm")}
    assert re.search(r"modgate/litellm: added p50 \S+x, added p99 \S+x, req/s \S+x", printed)
    # LiteLLM forwards its own serialisation of the body, but the same request: one more body, no more
    distinct, requests, replays = _stub_counts(printed)
    assert (distinct, requests) == (2, 1)
    assert replays >= 4 * 3 - distinct
    assert "every arm asked the engine the same" in printed


def test_the_overhead_benchmark_measures_modgate_with_worker_processes(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    overhead.main(["--requests", "6", "--rounds", "1", "--concurrency", "2", "--arms", "modgate",
                   "--paths", "cheapest", "--workers", "2", "--redis-url", redis_url, "--markdown"])
    printed = capsys.readouterr().out
    assert set(_rows(printed)) == {(2, "engine"), (2, "modgate"), (2, "modgate:workers-2")}
    assert "| clients | modgate req/s (÷ LiteLLM) | modgate:workers-2 req/s (÷ LiteLLM) |" in printed


def test_worker_arms_without_redis_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        overhead.main(["--workers", "2", "--redis-url", ""])
    assert "--workers needs --redis-url" in capsys.readouterr().err


def test_the_production_path_shapes_keeps_state_in_redis_misses_every_lookup_and_exports(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    overhead.main(["--requests", "6", "--rounds", "1", "--concurrency", "1", "2", "--arms", "modgate",
                   "--paths", "production", "--frames", "3", "--redis-url", redis_url])
    printed = capsys.readouterr().out
    arms = ("engine@production", "modgate@production")
    assert set(_rows(printed)) == {(c, arm) for c in (1, 2) for arm in arms}
    floor = re.search(r"production: 3 keyframe\(s\) of 1280x720 from (\d+) tenant\(s\), shaped to "
                      r"(\d+)x(\d+) \(\d+ image tokens, resized\); shaping floor ([\d.]+) ms", printed)
    assert floor, printed
    assert (int(floor[2]), int(floor[3])) != (1280, 720)  # shaped: the resize is on this path
    assert float(floor[4]) > 0
    distinct, requests, _ = _stub_counts(printed)
    assert (distinct, requests) == (3, 3)  # one request per keyframe, the same from both arms
    # only the path that ran is counted and described (the cheapest path's frame was once counted too)
    assert "like with like: 3 keyframe(s), 3 distinct engine requests" in printed, printed
    assert "every arm asked the engine the same" in printed
    assert "cheapest:" not in printed
    assert "verdict cache: modgate@production reused 0 verdicts (every lookup a miss)" in printed
    exported = re.search(r"OTLP export to the local receiver: (\d+) trace and (\d+) metric posts", printed)
    assert exported, printed
    assert int(exported[1]) >= 1  # the gateway's spans reached the receiver (flushed at the latest on stop)


def test_the_stub_counts_one_request_however_it_is_serialised() -> None:
    stub = engine_stub.create_stub_app()
    same = [b'{"model": "m", "temperature": 0}', b'{"temperature":0,"model":"m"}']

    async def post_both() -> dict[str, int]:
        transport = httpx.ASGITransport(app=stub)
        async with httpx.AsyncClient(transport=transport, base_url="http://stub") as client:
            for body in same:
                await client.post("/v1/chat/completions", content=body)
            last = (await client.get("/stub/last")).content
            info: dict[str, int] = (await client.get("/stub/info")).json()
        assert last == same[-1]
        return info

    info = asyncio.run(post_both())
    assert (info["distinct_requests"], info["requests"]) == (1, 2)


def test_an_arm_that_cannot_connect_is_named_with_its_load() -> None:
    """A refused connection stops the run with the arm's name and load, not a bare ConnectionRefusedError."""
    from bench.overhead_paths import Arm
    from bench.servers import free_port

    arm = Arm(f"http://127.0.0.1:{free_port()}/v1/chat/completions", [b"{}"], [b""], name="litellm")
    with pytest.raises(RuntimeError, match=r"the litellm arm failed at 2 client\(s\), with 0 answered: "
                                           r"ConnectionRefusedError"):
        asyncio.run(overhead.closed_loop(arm, 4, 2, overhead.ArmRun()))
