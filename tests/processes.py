"""Processes the tests start, stop and kill (gateways, a Redis of their own), and polling with a deadline."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

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


async def poll_async(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    """``poll`` on the event loop: ``condition`` may be a coroutine function (awaited) or a plain one; the
    loop runs between calls, so work the condition waits for (pub/sub, background tasks) goes on."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)


@dataclass
class GatewayProcess:
    """``python -m cli.main serve`` in a process of its own, to be killed like a real replica."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def spawn(cls, log_dir: Path, env: Mapping[str, str]) -> GatewayProcess:
        """Start one on a free port, ``env`` (``MODGATE_*``) over ours, its output to a log in ``log_dir``.

        It does not wait: several can import side by side; ``wait_ready`` each afterwards."""
        port = free_port()
        log_path = log_dir / f"gateway-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve", "--port", str(port)],
                env={**os.environ, "MODGATE_SERVER__LOG_LEVEL": "warning", **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return cls(f"http://127.0.0.1:{port}", process, log_path)

    def wait_ready(self, path: str) -> None:
        """Wait until ``path`` answers 200; fail, with what it printed, if it exits or time runs out."""
        try:
            # importing the gateway (Litestar, OpenTelemetry, scipy, scikit-learn) takes 2 s on an idle core
            # and over 60 s at load 30: the old 60 s failed tests/reliability/test_overload.py at its start
            wait_until_ready(f"{self.url}{path}", self.process, timeout_s=180)
        except RuntimeError as exc:
            pytest.fail(f"{exc}\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL (``kill -9``): no shutdown hook runs, no lease is given back."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> None:
        """SIGTERM if still running, without waiting (it drains MODGATE_SERVER__DRAIN_S first, then exits)."""
        if self.process.poll() is None:
            self.process.terminate()

    def stop(self) -> None:
        """Terminate if still running, and wait for it (killed after 10 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def peak_rss_bytes(self) -> int:
        """The process's peak resident memory (``VmHWM``)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc status")

    def log(self) -> str:
        """The end of what it printed (for failure messages)."""
        return self.log_path.read_text(errors="replace")[-4000:]


GatewayProcessFactory = Callable[..., GatewayProcess]
GatewayProcessesFactory = Callable[..., list[GatewayProcess]]


@dataclass
class RedisServer:
    """A ``redis-server`` of the test's own on a free port (never the machine's 6379), stopped and started
    again at will on the same port and data directory.

    ``persistent``: every write in the append-only file, fsynced, so a restart keeps every key; otherwise no
    persistence at all, so a restart loses every key (the worst case)."""

    directory: Path
    persistent: bool
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start and wait until it answers PING; fail if it exits first or takes longer than 20 s."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("these tests need the redis-server binary (apt-get install redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        where = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        # No RDB snapshots either way: persistence, when wanted, is the fsynced append-only file.
        appendonly = ["yes", "--appendfsync", "always"] if self.persistent else ["no"]
        process = subprocess.Popen(
            [binary, *where, "--save", "", "--appendonly", *appendonly, "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.process = process
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)

        def answers() -> bool:
            if process.poll() is not None:
                pytest.fail(f"redis-server on port {self.port} exited with {process.returncode}")
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        try:
            poll(answers, 20, f"redis-server on port {self.port}", every_s=0.02)
        finally:
            client.close()
        return self

    def stop(self) -> None:
        """Shut down (SIGTERM: the append-only file, if any, is flushed first)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to clients."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None
