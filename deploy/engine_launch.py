"""What both real engines' launchers share (``deploy/engine_cpu.py`` for vLLM, ``deploy/engine_llamacpp.py``
for llama.cpp): the cache folder and its locks, logged steps, the server's own process group tied to its
parent, the wait for ``GET /health``, the timed boot and the ``modgate engine-…`` run body.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Final, Self

import httpx

from deploy.engine_log import log_tail, root_cause

SERVED_MODEL_NAME: Final = "tiny"
# Looked up at import, not in the forked child, where loading anything could deadlock.
_PRCTL: Final = ctypes.CDLL(None, use_errno=True).prctl
_PR_SET_PDEATHSIG: Final = 1


@dataclass(frozen=True, slots=True)
class BootTimings:
    """Wall-clock seconds of each boot step in order (near zero when a step found its work already done)."""

    steps: tuple[tuple[str, float], ...]

    def summary(self) -> str:
        """One line for logs and terminal reports."""
        return ", ".join(f"{step} {seconds:.1f} s" for step, seconds in self.steps)

    def then(self, step: str, seconds: float) -> BootTimings:
        """These steps and one more."""
        return BootTimings((*self.steps, (step, seconds)))


Booted = tuple["EngineProcess", BootTimings]
"""A started engine and how long each step of its boot took."""


class EngineError(RuntimeError):
    """The CPU engine could not be installed, built or started; the message carries the log tail."""


class EngineExited(EngineError):
    """The server exited before it was ready: ``code`` is its exit status (negative: the signal)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code





def engine_home() -> Path:
    """The engine's cache folder: ``$MODGATE_ENGINE_HOME`` or ``~/.cache/modgate``."""
    configured = os.environ.get("MODGATE_ENGINE_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "modgate"



@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive file lock: two sessions booting at once must not install into one venv."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def run_logged(command: list[str], log_path: Path, *, env: dict[str, str] | None = None) -> None:
    """Run one step with its output appended to the log; fail with the log tail."""
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        completed = subprocess.run(  # noqa: S603 - fixed argument lists built in this module
            command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        )
    if completed.returncode != 0:
        raise EngineError(
            f"{' '.join(command)} exited {completed.returncode}; last lines of {log_path}:\n"
            + log_tail(log_path)
        )



def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port



def die_with_parent() -> None:
    """Have Linux SIGTERM the server if the process that started it dies, so no engine is orphaned.

    The server runs in its own session (so ``stop`` can signal its whole group), which also shields it
    from the terminal's Ctrl-C and from a killed parent; this ties its life to the parent's instead.
    """
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def client_host(host: str) -> str:
    """The address a local client dials for a server bound to ``host``."""
    return "127.0.0.1" if host in {"0.0.0.0", "", "::"} else host  # noqa: S104 - mapping, not binding


class EngineProcess:
    """A running api_server; ``stop`` ends its whole process group (the server and its engine core)."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
        """Wrap a started server process."""
        self.process = process
        self.url = url
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """The server's process id (also its process group id)."""
        return self.process.pid

    def rss_bytes(self) -> int:
        """Resident memory of the whole process group (server, engine core, helpers), from /proc."""
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.process.pid:  # field 5 of stat, the process group id
                    total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
            except (OSError, IndexError, ValueError):
                continue  # the process exited between listing and reading
        return total

    def stop(self, grace_s: float = 20.0) -> None:
        """Terminate the process group, then kill it if it has not exited within ``grace_s``."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=grace_s)
        # The engine core is a child in the same group and may outlive the server by a moment.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> Self:
        """Use as a context manager that stops the engine on exit."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the engine."""
        self.stop()



def launch_server(
    command: list[str], env: dict[str, str], log: Path, url: str, ready_timeout: float, server: str
) -> EngineProcess:
    """Start a server in its own process group, logged to ``log``; wait until ``GET /health`` is 200."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as log_file:
        process = subprocess.Popen(  # noqa: S603 - fixed argument lists built by this module's callers
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group, so stop() reaches the engine core too
            preexec_fn=die_with_parent,  # one foreign call between fork and exec, resolved beforehand
        )
    engine = EngineProcess(process, url, log)
    try:
        wait_until_healthy(engine, ready_timeout, server)
    except BaseException:
        engine.stop()
        raise
    return engine


def wait_until_healthy(engine: EngineProcess, timeout: float, server: str = "vLLM") -> None:
    """Poll ``/health`` until 200, the process dies, or ``timeout`` seconds pass (``server`` names it)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        while True:
            code = engine.process.poll()
            if code is not None:
                cause = root_cause(engine.log_path)
                raise EngineExited(
                    f"{server} exited with code {code} before it was ready"
                    + ("" if cause is None else f": {cause}")
                    + f"\nlast lines of {engine.log_path}:\n"
                    + log_tail(engine.log_path),
                    code,
                )
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{engine.url}/health").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{server} was not ready after {timeout:.0f} s; last lines of {engine.log_path}:\n"
                    + log_tail(engine.log_path)
                )
            time.sleep(1.0)



def interrupt_to_keyboard(signum: int, frame: FrameType | None) -> None:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so the engine is stopped on the way out."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def serve_until_interrupted(
    command: str, ready: str, stopping: str, exited: str, boot: Callable[[], Booted]
) -> int:
    """Boot an engine with ``boot``, print its URL and step times, serve until Ctrl-C (the run body of
    ``modgate engine-cpu`` and ``modgate engine-llamacpp``); exit code 1 when the engine dies on its own."""
    # Ctrl-C explicitly (a shell may start background jobs with SIGINT ignored); a supervisor's SIGTERM
    # or a closed terminal's SIGHUP must stop the engine too, not leave it running in its own session.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt_to_keyboard)
    signal.signal(signal.SIGHUP, interrupt_to_keyboard)
    try:
        engine, timings = boot()
    except EngineError as exc:
        print(f"modgate {command}: {exc}", file=sys.stderr)
        # the engine's own exit status when it exited with one (a signal, or any other failure: 1)
        return exc.code if isinstance(exc, EngineExited) and exc.code > 0 else 1
    except KeyboardInterrupt:
        return 130
    with engine:
        print(f"{ready} at {engine.url} (model {SERVED_MODEL_NAME!r}, log {engine.log_path})")
        print(timings.summary())
        print("Ctrl-C stops it.", flush=True)
        try:
            code = engine.process.wait()
        except KeyboardInterrupt:
            print(f"stopping {stopping}", file=sys.stderr)
            return 0
    print(f"{exited} exited with code {code}; last lines of {engine.log_path}:\n{log_tail(engine.log_path)}")
    return 1 if code != 0 else 0
