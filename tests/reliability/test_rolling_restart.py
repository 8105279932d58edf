"""A rolling restart behind a real HAProxy (health checks on /readyz) under steady traffic from the openai
client and jobs: no request fails, no job is lost or completed twice, the engine never gets more than its
cap of 8, and every replica exits 0 (bench/rolling.py runs the same fleet and prints the figures)."""

from __future__ import annotations

from pathlib import Path

from bench.rolling import options, run


def test_a_rolling_restart_behind_haproxy_fails_no_request_and_loses_no_job(tmp_path: Path) -> None:
    report = run(options(["--replicas", "2", "--clients", "6", "--warmup-s", "1", "--tail-s", "1",
                          "--work-dir", str(tmp_path)]))

    requests, jobs, engine = report["requests"], report["jobs"], report["engine"]
    assert requests["answered"] > 0
    assert requests["failed"] == 0, requests["first_failures"]
    assert jobs["submitted"] > 0
    assert jobs["submissions_failed"] == 0, jobs["first_submission_failures"]
    assert jobs["lost"] == 0
    assert jobs["completed_twice"] == 0
    assert engine["peak_requests"] <= engine["cap"]
    assert [row["exit_status"] for row in report["restarts"]] == [0, 0]
