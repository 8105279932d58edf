"""A newcomer's first ``make serve`` (``modgate serve`` with nothing set) logs no warning or error about the
engine it started itself: only the two it owes, no API keys and no Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.servers import free_port, wait_until_ready

OWED = [
    "MODGATE_AUTH__API_KEYS is unset: business calls need NO API key",
    "MODGATE_REDIS__URL is unset: jobs are kept in memory and are NOT durable",
]


def test_serve_with_nothing_set_warns_only_of_the_missing_api_keys_and_redis(tmp_path: Path) -> None:
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("MODGATE_")}
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port)],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/readyz", process, timeout_s=180)
        for _ in range(600):  # the prefix strategy is chosen (and primed, where it primes) at start
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).json()
            (prefix,) = ready["prefix_cache"].values()
            if prefix["strategy"] is not None and (prefix["strategy"] != "prime" or prefix["primed"]):
                break
            time.sleep(0.05)
        assert prefix["strategy"] != "uncacheable", prefix
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/moderations", timeout=60,
                            json={"model": "m", "input": "a first request"})
        assert answer.status_code == 200, answer.text
        printed = log_path.read_text(errors="replace")  # up to the first answer (not the stop's own lines)
    finally:
        process.terminate()
        process.wait(30)
    flagged = [line for line in printed.splitlines() if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)]
    assert len(flagged) == len(OWED), printed
    for line, owed in zip(flagged, sorted(OWED, key=printed.index), strict=True):
        assert owed in line, printed
