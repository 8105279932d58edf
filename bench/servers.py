"""Start modgate's own processes for benchmarks: the simulator and the gateway, each in its own process."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Poll ``url`` until it answers 200, or fail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready within {timeout_s:g} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask a server process to end; kill it if it has not within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def process(
    args: list[str], ready_url: str, env: dict[str, str] | None = None, ready_timeout_s: float = 60
) -> Iterator[int]:
    """Run a server process until the block ends; yields its pid."""
    proc = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL)
    try:
        wait_until_ready(ready_url, proc, ready_timeout_s)
        yield proc.pid
    finally:
        stop(proc)


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) a process has used so far, from ``/proc`` (Linux; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def simulator(preset: str = "instant", time_scale: float = 0.0, *extra: str) -> Iterator[str]:
    """``modgate engine-sim`` in a process of its own; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        sys.executable,
        "-m",
        "cli.main",
        "engine-sim",
        "--port",
        str(port),
        "--preset",
        preset,
        "--time-scale",
        str(time_scale),
        *extra,
    ]
    with process(args, f"{url}/health"):
        yield url


@contextlib.contextmanager
def gateway(engine_url: str, **env: str) -> Iterator[str]:
    """``modgate serve`` in a process of its own, in front of ``engine_url``; yields its URL."""
    with gateway_process(engine_url, **env) as (url, _):
        yield url


@contextlib.contextmanager
def gateway_process(engine_url: str, **env: str) -> Iterator[tuple[str, int]]:
    """``modgate serve`` in a process of its own, in front of ``engine_url``; yields its URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "cli.main", "serve", "--port", str(port)]
    # Worker processes each import the gateway (seconds apiece; over a minute at load 27) before it is ready.
    with process(
        args,
        f"{url}/readyz",
        {"MODGATE_ENGINE__URL": engine_url, "MODGATE_SERVER__LOG_LEVEL": "warning", **env},
        ready_timeout_s=180 * max(1, int(env.get("MODGATE_WORKERS", "1"))),
    ) as pid:
        yield url, pid
