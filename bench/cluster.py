"""A small fleet on one machine, from real parts: a private ``redis-server``, gateway replicas that can be
restarted on their own ports, and HAProxy (Debian's) in front of them, health-checking ``/readyz``.

Used by ``bench.rolling`` (and the tests that hold its figures); nothing here is the product.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port, wait_until_ready


class ClusterError(RuntimeError):
    """A part of the fleet would not start, or did not stop as it should."""


def need(binary: str, package: str) -> str:
    """The path of ``binary``, or a clear error naming the Debian package that has it."""
    found = shutil.which(binary)
    if found is None:
        raise ClusterError(f"{binary} is missing: apt-get install -y {package} (scripts/test installs it)")
    return found


@dataclass
class RedisProcess:
    """``redis-server`` on a free loopback port with no persistence, in ``directory``."""

    directory: Path
    port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ()
    command: tuple[str, ...] = ()  # before the options: a configuration file (and ``--sentinel``)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        """Start it and wait until it answers PING."""
        import redis

        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [need("redis-server", "redis-server"), *self.command, "--port", str(self.port),
             "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", "", "--appendonly", "no",
             *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 20
        try:
            while True:
                if self.process.poll() is not None:
                    raise ClusterError(f"redis-server on {self.port} exited with {self.process.returncode}")
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return self
                if time.monotonic() > deadline:
                    raise ClusterError(f"redis-server on {self.port} did not answer within 20 s")
                time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: no goodbye to its clients or replicas."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM, then wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Replica:
    """One ``modgate serve`` replica on a port of its own, which it keeps across restarts."""

    name: str
    env: dict[str, str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    exit_codes: list[int] = field(default_factory=list)  # of every stop so far

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        """Start it (without waiting: several import side by side); its output goes to a log file."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{self.name}.log").open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                env={**os.environ, "MODGATE_SERVER__LOG_LEVEL": "warning", **self.env},
                stdout=log, stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout_s: float = 180) -> None:
        """Until ``/readyz`` answers 200 (importing the gateway takes seconds on a busy machine)."""
        assert self.process is not None
        try:
            wait_until_ready(f"{self.url}/readyz", self.process, timeout_s)
        except RuntimeError as exc:
            raise ClusterError(f"{self.name}: {exc}\n{self.log()}") from exc

    def signal_term(self) -> None:
        """SIGTERM: the drain begins."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def terminate(self, timeout_s: float = 120) -> int:
        """SIGTERM (the drain begins), then wait for the exit; its status is kept and answered."""
        self.signal_term()
        return self.wait_exit(timeout_s)

    def wait_exit(self, timeout_s: float = 120) -> int:
        """Wait for the exit after SIGTERM; its status is kept and answered."""
        assert self.process is not None
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.process.kill()
            self.process.wait()
            raise ClusterError(f"{self.name} did not exit within {timeout_s:g} s of SIGTERM") from exc
        self.exit_codes.append(code)
        return code

    def stop(self) -> None:
        """End it if still running (the end of a run)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ClusterError):
                self.terminate(60)

    def log(self) -> str:
        """The end of its log."""
        path = self.log_dir / f"{self.name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


HAPROXY_CONFIG = """\
# HAProxy in front of modgate replicas: health checks on /readyz, so a draining replica (503) leaves the
# rotation within one check while it still serves what it was sent.
global
    maxconn 2000
    # Requests up to this size are kept whole, so a request that met a connection just closed by a
    # stopping replica can be sent again (retry-on below); a keyframe's JSON is well under it.
    tune.bufsize 1048576

defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 10s
    # Resend only what a replica provably never answered: a refused connection, or one closed before any
    # byte of the response came back.
    retries 3
    retry-on conn-failure empty-response
    option redispatch 1
    # The whole body is read before a replica is picked, so it is still there to send again: without it,
    # HAProxy 2.6 has streamed the body on and cannot retry a request whose replica died (kill -9) before
    # answering (the caller got a 502 or a dropped connection; bench.soak found it).
    option http-buffer-request
    option httpchk
    http-check send meth GET uri /readyz
    http-check expect status 200
    # A check may take a while on a busy machine (it asks the engine too), so it gets 5 s; two failed
    # checks in a row take a replica out: 0.5 s after a draining one answers 503, whereas one starved of
    # CPU for a few seconds stays in (it is still serving, only slowly).
    timeout check 5s
    default-server inter {check_ms}ms fastinter {check_ms}ms downinter {check_ms}ms fall 2 rise 1

frontend modgate
    bind 127.0.0.1:{port}
    default_backend gateways

frontend stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /stats

backend gateways
    balance leastconn
{servers}
"""


@dataclass
class HAProxy:
    """Debian's HAProxy in the foreground, balancing over ``replicas``; ``states()`` reads its stats page."""

    replicas: list[Replica]
    directory: Path
    check_ms: int = 250
    port: int = field(default_factory=free_port)
    stats_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The balanced address the callers use."""
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        """The configuration file's text."""
        servers = "\n".join(
            f"    server {replica.name} 127.0.0.1:{replica.port} check" for replica in self.replicas
        )
        return HAPROXY_CONFIG.format(
            port=self.port, stats_port=self.stats_port, check_ms=self.check_ms, servers=servers
        )

    def start(self) -> HAProxy:
        """Write the configuration, check it (``haproxy -c``), start it and wait for its stats page."""
        binary = need("haproxy", "haproxy")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "haproxy.cfg"
        path.write_text(self.config())
        checked = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True, check=False)
        if checked.returncode != 0:
            raise ClusterError(f"haproxy -c refused the configuration:\n{checked.stdout}{checked.stderr}")
        with (self.directory / "haproxy.log").open("wb") as log:
            self.process = subprocess.Popen(
                [binary, "-db", "-f", str(path)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(httpx.HTTPError):
                self.states()
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise ClusterError("haproxy did not start (see haproxy.log)")
            time.sleep(0.1)

    def states(self) -> dict[str, str]:
        """Each replica's state as HAProxy sees it now (``UP``, ``DOWN``, ...)."""
        text = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5).text.lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {row["svname"]: row["status"] for row in rows if row["pxname"] == "gateways"
                and row["svname"] not in ("FRONTEND", "BACKEND")}

    def wait_state(self, name: str, state: str, timeout_s: float = 60) -> float:
        """Until HAProxy sees replica ``name`` in ``state``; answers the seconds it took."""
        started = time.monotonic()
        while not self.states().get(name, "").startswith(state):
            if time.monotonic() - started > timeout_s:
                raise ClusterError(f"haproxy did not see {name} {state} within {timeout_s:g} s")
            time.sleep(0.05)
        return time.monotonic() - started

    def stop(self) -> None:
        """SIGTERM (HAProxy's hard stop), then wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@contextlib.contextmanager
def running(*parts: RedisProcess | Replica | HAProxy | SentinelFleet) -> Iterator[None]:
    """Stop ``parts`` (in reverse order) when the block ends, however it ends."""
    try:
        yield
    finally:
        for part in reversed(parts):
            part.stop()


# A primary (or a replica promoted to one) syncs a new replica at once, not after Redis's default 5 s wait
# for more replicas to share the transfer: a fleet or a rejoined server is in sync seconds sooner.
SYNC_NOW = ("--repl-diskless-sync-delay", "0")

SENTINEL_CONFIG = """\
port {port}
bind 127.0.0.1
dir {directory}
sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}
sentinel down-after-milliseconds {service} {down_after_ms}
sentinel failover-timeout {service} 10000
sentinel parallel-syncs {service} 1
"""


@dataclass
class SentinelFleet:
    """A Redis primary, ``replicas`` replicas of it and ``sentinels`` sentinels (``redis-server --sentinel``),
    each a real process on a loopback port of its own; ``url`` is what ``MODGATE_REDIS__URL`` takes."""

    directory: Path
    service: str = "modgate"
    replicas: int = 1
    sentinels: int = 3
    down_after_ms: int = 1000
    servers: list[RedisProcess] = field(default_factory=list)
    watchers: list[RedisProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,…/modgate/0``."""
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.watchers)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self) -> SentinelFleet:
        """The primary, then its replicas (synced), then the sentinels (each seeing every replica)."""
        primary = RedisProcess(self.directory / "primary", extra=SYNC_NOW).start()
        self.servers.append(primary)
        for index in range(self.replicas):
            replica = RedisProcess(self.directory / f"replica-{index}",
                                   extra=(*SYNC_NOW, "--replicaof", "127.0.0.1", str(primary.port))).start()
            self.servers.append(replica)
        self._wait(lambda: self.primary_info().get("connected_slaves") == str(self.replicas),
                   "the replicas to sync with the primary")
        for index in range(self.sentinels):
            folder = self.directory / f"sentinel-{index}"
            folder.mkdir(parents=True, exist_ok=True)
            sentinel = RedisProcess(folder)
            config = folder / "sentinel.conf"
            config.write_text(SENTINEL_CONFIG.format(
                port=sentinel.port, directory=folder, service=self.service, primary_port=primary.port,
                quorum=self.sentinels // 2 + 1, down_after_ms=self.down_after_ms,
            ))
            sentinel.command = (str(config), "--sentinel")
            self.watchers.append(sentinel.start())
        self._wait(lambda: all(self._sentinel_sees_replicas(s) for s in self.watchers),
                   "every sentinel to see the replicas")
        return self

    def _sentinel_sees_replicas(self, sentinel: RedisProcess) -> bool:
        import redis

        client = redis.Redis(port=sentinel.port, socket_timeout=2)
        try:
            master: Any = client.sentinel_master(self.service)
            return int(master.get("num-slaves", 0)) == self.replicas and int(
                master.get("num-other-sentinels", 0)) == self.sentinels - 1
        except redis.RedisError:
            return False
        finally:
            client.close()

    @staticmethod
    def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers says it is now."""
        import redis

        for sentinel in self.watchers:
            client = redis.Redis(port=sentinel.port, socket_timeout=1)
            try:
                address: Any = client.sentinel_get_master_addr_by_name(self.service)
            except redis.RedisError:
                continue
            finally:
                client.close()
            if address:
                return int(address[1])
        return None

    def primary(self) -> RedisProcess:
        """The server that is the primary now."""
        port = self.primary_port()
        return next(server for server in self.servers if server.port == port)

    def primary_info(self) -> dict[str, str]:
        """``INFO replication`` of the first server (the primary at the start)."""
        import redis

        client = redis.Redis(port=self.servers[0].port, socket_timeout=2, decode_responses=True)
        try:
            return {key: str(value) for key, value in client.info("replication").items()}
        finally:
            client.close()

    def stop(self) -> None:
        """Every sentinel and server."""
        for part in [*self.watchers, *self.servers]:
            part.stop()
