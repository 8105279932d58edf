"""Gateway processes that share a Redis, and polling with a deadline, for the multi-engine tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.servers import free_port, wait_until_ready


def poll(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    """Call ``condition`` until it answers something truthy (and answer it), or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


@dataclass
class GatewayProcess:
    """``python -m gateway.cli serve`` in a process of its own, so it can be killed like a real replica."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, no lease is given back."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """Terminate if still running."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        """The end of what it printed (for failure messages)."""
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def gateway_processes(tmp_path: Path) -> Iterator[Callable[..., list[GatewayProcess]]]:
    """``gateway_processes(n, **MODGATE_env)``: n gateways started side by side; stopped after the test."""
    started: list[GatewayProcess] = []

    def start(count: int, **env: str) -> list[GatewayProcess]:
        batch = []
        for _ in range(count):
            port = free_port()
            log_path = tmp_path / f"gateway-{port}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
                    env={**os.environ, "MODGATE_LOG_LEVEL": "warning", **env},
                    stdout=log, stderr=subprocess.STDOUT,
                )
            batch.append(GatewayProcess(f"http://127.0.0.1:{port}", process, log_path))
        started.extend(batch)
        for gateway in batch:  # started together: the imports overlap
            try:
                wait_until_ready(f"{gateway.url}/readyz", gateway.process)
            except RuntimeError as exc:
                pytest.fail(f"{exc}\n{gateway.log()}")
        return batch

    yield start
    for gateway in started:
        gateway.stop()
