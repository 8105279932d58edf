"""The soak's fleet, from real parts on this machine, and the faults it suffers (``bench.soak``).

Redis behind Sentinel (a primary, a replica, three sentinels: ``bench.cluster.SentinelFleet``), two simulated
engines (``modgate engine-sim``: one on vLLM's wire, one on llama-server's), two gateway replicas behind
HAProxy (``bench.cluster``), and a webhook receiver in this process. Every part can be killed and started
again on its own port; :class:`Fleet` does each fault the soak schedules.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.cluster import SYNC_NOW, HAProxy, RedisProcess, Replica, SentinelFleet
from bench.servers import free_port, wait_until_ready
from deploy.simulator.app import COUNTS_LINE
from gateway.jobs.webhooks import verify_webhook

WEBHOOK_SECRET = "soak-webhook-secret-0123456789"  # noqa: S105 - a local receiver's test secret
ADMIN_TOKEN = "soak-admin-token-0123456789"  # noqa: S105 - the soak's own gateways
API_KEYS = {"tenant-a": "soak-key-a", "tenant-b": "soak-key-b"}
MODELS = ("qwen3-vl-moe-sim", "qwen3-vl-moe-sim-v2")  # the vLLM engine's model before and after the swap


@dataclass
class Engine:
    """One ``modgate engine-sim`` on a port of its own, which it keeps across restarts."""

    name: str
    kind: str  # "vllm" or "llamacpp"
    cap: int  # the gateways' cap on it (llama.cpp: its slots)
    time_scale: float
    log_dir: Path
    model: str | None = None  # vLLM's --served-model-name (None: the preset's)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait for ``/health``."""
        args = [sys.executable, "-m", "cli.main", "engine-sim", "--port", str(self.port),
                "--preset", "spark", "--kind", self.kind, "--time-scale", str(self.time_scale)]
        args += ["--slots", str(self.cap)] if self.kind == "llamacpp" else ["--max-num-seqs", "16"]
        if self.model is not None:
            args += ["--served-model-name", self.model]
        with (self.log_dir / f"{self.name}.log").open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_until_ready(f"{self.url}/health", self.process)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGKILL after 10 s)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def faults(self, **rates: float) -> None:
        """Switch the simulator's faults (none: every fault off)."""
        httpx.post(f"{self.url}/sim/faults", json=rates, timeout=5).raise_for_status()

    def answers_whole(self) -> int:
        """Chat completions it answered whole over every run: each stopped run's count from its log, and the
        running one's from ``/sim/info`` (0 for it when it does not answer)."""
        log = (self.log_dir / f"{self.name}.log").read_text(errors="replace")
        stopped = sum(int(line.removeprefix(COUNTS_LINE)) for line in log.splitlines()
                      if line.startswith(COUNTS_LINE))
        try:
            running = int(httpx.get(f"{self.url}/sim/info", timeout=5).json()["answers_whole"])
        except (httpx.HTTPError, ValueError, KeyError):
            running = 0
        return stopped + running

    def peaks(self) -> int | None:
        """The most requests at it (running and waiting) since the last read; None when it does not answer."""
        try:
            return int(httpx.post(f"{self.url}/sim/peaks", timeout=2).json()["peak_requests"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None


class WebhookReceiver:
    """Signed deliveries per ``X-Modgate-Delivery`` (the job id), on a port it keeps while it is stopped."""

    def __init__(self) -> None:
        self.deliveries: Counter[str] = Counter()
        self.bad_signatures = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        """Serve (again)."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                good = verify_webhook(WEBHOOK_SECRET, self.headers.get("x-modgate-signature", ""), body)
                with receiver._lock:
                    if good:
                        receiver.deliveries[self.headers.get("x-modgate-delivery", "?")] += 1
                    else:
                        receiver.bad_signatures += 1
                self.send_response(204 if good else 400)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop serving: deliveries meet a refused connection until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class Fleet:
    """Every part of the soak, started by :meth:`start` and stopped by :meth:`stop` whatever happened."""

    directory: Path
    time_scale: float
    settings: dict[str, str]  # MODGATE_* of both replicas, beside what the fleet sets itself
    redis: SentinelFleet = field(init=False)
    engines: list[Engine] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)
    proxy: HAProxy | None = None
    receiver: WebhookReceiver = field(default_factory=WebhookReceiver)

    def __post_init__(self) -> None:
        self.logs = self.directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.redis = SentinelFleet(self.directory / "redis", replicas=1, sentinels=3, down_after_ms=4000)
        self.engines = [
            Engine("engine-vllm", "vllm", 4, self.time_scale, self.logs, model=MODELS[0]),
            Engine("engine-llamacpp", "llamacpp", 2, self.time_scale, self.logs),
        ]

    @property
    def url(self) -> str:
        """HAProxy's address: what the callers use."""
        assert self.proxy is not None
        return self.proxy.url

    def env(self) -> dict[str, str]:
        """The replicas' settings."""
        engines = self.engines
        return {
            "MODGATE_ENGINE__URL": ",".join(e.url for e in engines),
            "MODGATE_ENGINE__CAPS": ",".join(f"{e.url}={e.cap}" for e in engines),
            "MODGATE_ENGINE__KINDS": ",".join(f"{e.url}={e.kind}" for e in engines),
            "MODGATE_REDIS__URL": self.redis.url,
            "MODGATE_AUTH__API_KEYS": ",".join(f"{key}:{tenant}" for tenant, key in API_KEYS.items()),
            "MODGATE_AUTH__ADMIN_TOKEN": ADMIN_TOKEN,
            "MODGATE_JOBS__WEBHOOK_SECRET": WEBHOOK_SECRET,
            "MODGATE_JOBS__WEBHOOK_ALLOWLIST": "127.0.0.1",
            "MODGATE_DECISIONS__ARCHIVE_DIR": str(self.directory / "decisions"),
            "MODGATE_QUALITY__RECORDS_DIR": str(self.directory / "quality"),
            "MODGATE_CONSOLE__REPORTS_DIR": str(self.directory / "reports"),
            "MODGATE_VIDEOS__SPOOL_DIR": str(self.directory / "videos"),  # both replicas' one spool
            **self.settings,
        }

    def start(self) -> Fleet:
        """Redis and its sentinels, the engines, the receiver, both replicas (side by side), then HAProxy."""
        self.redis.start()
        for engine in self.engines:
            engine.start()
        self.receiver.start()
        env = self.env()
        self.replicas = [Replica(f"gateway-{i}", env, self.logs) for i in range(2)]
        for replica in self.replicas:
            replica.spawn()
        for replica in self.replicas:
            replica.wait_ready()
        self.proxy = HAProxy(self.replicas, self.directory / "haproxy").start()
        return self

    def stop(self) -> None:
        """Every part, the callers' side first."""
        for part in [self.proxy, *self.replicas, *self.engines]:
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()
        self.receiver.stop()
        self.redis.stop()

    # --- the faults: each returns once the part is back (or, for a window, once it is over) ---

    def kill_replica(self, index: int) -> None:
        """``kill -9`` of a replica, then the same replica started again on its port."""
        replica = self.replicas[index]
        assert replica.process is not None
        replica.process.kill()
        replica.process.wait(10)
        replica.spawn()
        replica.wait_ready()

    def restart_engine(self, index: int, model: str | None = None, down_s: float = 1.0) -> None:
        """An engine stopped (SIGTERM, as an orchestrator does) and started again after ``down_s``, serving
        ``model`` when given (a model swap)."""
        engine = self.engines[index]
        engine.stop()
        time.sleep(down_s)
        if model is not None:
            engine.model = model
        engine.start()

    def kill_redis_primary(self, timeout_s: float = 60) -> None:
        """SIGKILL of the Redis primary; once the sentinels name another, it comes back as its replica."""
        old = self.redis.primary()
        old.kill()
        deadline = time.monotonic() + timeout_s
        while (port := self.redis.primary_port()) in (None, old.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no new Redis primary within {timeout_s:g} s")
            time.sleep(0.1)
        follows = (*SYNC_NOW, "--replicaof", "127.0.0.1", str(port))
        back = RedisProcess(old.directory, port=old.port, extra=follows)
        self.redis.servers[self.redis.servers.index(old)] = back.start()
        # Over only once it holds the primary's data: promoted before then (the next fault stalls the
        # primary), it would hand the sentinels an empty data set and every other server would copy it.
        synced = redis.Redis(port=back.port, socket_timeout=2, decode_responses=True)
        try:
            while synced.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the old primary did not sync within {timeout_s:g} s")
                time.sleep(0.1)
        finally:
            synced.close()

    def stall_redis(self, seconds: float) -> None:
        """The primary stopped (SIGSTOP) for ``seconds``, under the sentinels' down-after: every call to it
        hangs, as on a stalled network, and none fails over."""
        primary = self.redis.primary()
        assert primary.process is not None
        os.kill(primary.process.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(primary.process.pid, signal.SIGCONT)

    def redis_primary_url(self) -> str:
        """A direct URL of the primary now (for reading the soak's results)."""
        return f"redis://127.0.0.1:{self.redis.primary_port()}/0"


def ok_engine_calls(replica_url: str) -> Counter[tuple[str, str]]:
    """A replica's ``modgate_engine_calls_total{outcome="ok"}`` by (engine URL, purpose) since it started;
    empty when it does not answer."""
    try:
        text = httpx.get(f"{replica_url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return Counter()
    calls: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "modgate_engine_calls_total" and sample.labels.get("outcome") == "ok":
                calls[sample.labels["engine"], sample.labels["purpose"]] += int(sample.value)
    return calls
