"""Soak: minutes of mixed load with the simulator's faults switched on, and one ``kill -9`` of the gateway.

Each part in a process of its own: the engine simulator (Spark preset, sped up by ``--time-scale``, faults
on: 500s, slow first tokens past the gateway's first-token deadline, streams cut mid-answer, answers that
are not JSON), a Redis of the soak's own (append-only, so jobs are durable), and the gateway. The driver
runs, side by side for ``--duration`` seconds:

- ``--clients`` closed-loop live callers of ``POST /v1/moderations``: mostly one keyframe, some two, some
  with thinking off, and a share of bad input (a truncated JPEG, a GIF) that must get its 4xx;
- a job submitter: a 4-frame job every ``--job-every`` seconds, each with an Idempotency-Key (half of them
  submitted twice, as a retrying client would) and a webhook to a receiver in this process;
- halfway through, the gateway is killed with SIGKILL and started again on the same port.

Then it stops the load, waits for every accepted job to finish, and reports: requests answered (and how),
errors by kind (status and code, or the transport error when no answer came), jobs submitted / succeeded /
failed / lost (lost must be 0), how many times each job was completed (must be 1), webhooks delivered, and
the peak resident memory of the gateway processes, the simulator and Redis.

    python -m bench.soak [--duration 300] [--clients 12] [--time-scale 0.05] [--json soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis
from PIL import Image

from bench.servers import free_port, wait_until_ready
from deploy.keyframes import make_keyframe
from gateway.jobs.store_redis import RedisJobStore
from gateway.jobs.webhooks import verify_webhook

WEBHOOK_SECRET = "soak-webhook-secret-0123456789"  # noqa: S105 - a local receiver's test secret
LABELS = ("allow", "allow", "allow", "review", "block:violence", "block:sexual")


def rss_bytes(pid: int, field_name: str = "VmRSS") -> int:
    """A process's resident memory now (``VmRSS``) or at its peak (``VmHWM``), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


@dataclass
class Process:
    """A child process and the peak memory seen of it."""

    name: str
    popen: subprocess.Popen[bytes]
    peak_rss: int = 0

    def sample(self) -> None:
        """Record the peak (the kernel's high-water mark, which covers moments between samples)."""
        self.peak_rss = max(self.peak_rss, rss_bytes(self.popen.pid, "VmHWM"))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop and wait (SIGKILL after 10 s)."""
        self.sample()
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def spawn(name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Process:
    """Start a process with its output in ``log_dir/<name>.log``."""
    with (log_dir / f"{name}.log").open("ab") as log:
        popen = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=log,
                                 stderr=subprocess.STDOUT)
    return Process(name, popen)


@dataclass
class Tally:
    """What the load saw."""

    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # "200 allow", "429 queue_full", "transport ..."
    bad_input_wrongly_accepted: int = 0
    frames_verdicted: int = 0
    jobs: dict[str, str] = field(default_factory=dict)  # idempotency key → job id
    job_submit_outcomes: Counter[str] = field(default_factory=Counter)
    replays_matching: int = 0
    replays_mismatched: int = 0


class WebhookReceiver:
    """Counts signed deliveries per job (a local HTTP server)."""

    def __init__(self) -> None:
        self.deliveries: Counter[str] = Counter()
        self.bad_signatures = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                good = verify_webhook(WEBHOOK_SECRET, self.headers.get("x-modgate-signature", ""), body)
                with lock:
                    if good:
                        receiver.deliveries[self.headers.get("x-modgate-delivery", "?")] += 1
                    else:
                        receiver.bad_signatures += 1
                self.send_response(204 if good else 400)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def data_url(image: bytes, mime: str = "image/jpeg") -> str:
    """A base64 ``data:`` URL."""
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def part(image: bytes, mime: str = "image/jpeg") -> dict[str, Any]:
    """One ``image_url`` input part."""
    return {"type": "image_url", "image_url": {"url": data_url(image, mime)}}


def bad_images() -> list[tuple[str, bytes]]:
    """Inputs that must be refused with a 4xx."""
    frame = make_keyframe("allow", 320, 180, seed=999)
    gif = io.BytesIO()
    Image.new("RGB", (32, 32)).save(gif, "GIF")
    return [("image/jpeg", frame[: len(frame) // 2]), ("image/gif", gif.getvalue())]


def outcome_of(response: httpx.Response) -> str:
    """``"200"`` or ``"<status> <error code>"``."""
    if response.status_code < 400:
        return str(response.status_code)
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "not-openai-shape"
    return f"{response.status_code} {code}"


async def live_caller(client: httpx.AsyncClient, tally: Tally, frames: list[bytes], stop_at: float,
                      rng: random.Random) -> None:
    """One closed-loop caller of ``POST /v1/moderations``."""
    bad = bad_images()
    while time.monotonic() < stop_at:
        roll = rng.random()
        headers: dict[str, str] = {}
        expect_refusal = False
        if roll < 0.06:
            mime, image = rng.choice(bad)
            body: dict[str, Any] = {"input": [part(image, mime)]}
            expect_refusal = True
        elif roll < 0.16:
            body = {"input": [part(rng.choice(frames)), part(rng.choice(frames))]}
        else:
            body = {"input": [part(rng.choice(frames))]}
            if roll > 0.9:
                headers["X-Modgate-Thinking"] = "off"
        tally.sent += 1
        try:
            response = await client.post("/v1/moderations", json=body, headers=headers)
        except httpx.HTTPError as exc:
            tally.outcomes[f"transport {type(exc).__name__}"] += 1
            await asyncio.sleep(0.2)
            continue
        outcome = outcome_of(response)
        if response.status_code == 200:
            results = response.json()["results"]
            tally.frames_verdicted += len(results)
            outcome = f"200 {results[0]['modgate']['action']}"
            if expect_refusal:
                tally.bad_input_wrongly_accepted += 1
        tally.outcomes[outcome] += 1
        if response.status_code in (429, 503) and "retry-after" in response.headers:
            await asyncio.sleep(min(2.0, float(response.headers["retry-after"])) * rng.random())


async def job_submitter(client: httpx.AsyncClient, tally: Tally, frames: list[bytes], stop_at: float,
                        every_s: float, webhook_url: str, rng: random.Random) -> None:
    """A job every ``every_s`` seconds; half of them sent twice with the same Idempotency-Key."""
    number = 0
    while time.monotonic() < stop_at:
        key = f"soak-job-{number}"
        body = {"video_id": f"video-{number}", "frames": [part(rng.choice(frames)) for _ in range(4)],
                "webhook_url": webhook_url}
        for attempt in range(2 if number % 2 else 1):
            try:
                response = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
            except httpx.HTTPError as exc:
                tally.job_submit_outcomes[f"transport {type(exc).__name__}"] += 1
                continue
            tally.job_submit_outcomes[outcome_of(response)] += 1
            if response.status_code != 202:
                continue
            job_id = response.json()["id"]
            if key in tally.jobs and attempt > 0:
                if tally.jobs[key] == job_id:
                    tally.replays_matching += 1
                else:
                    tally.replays_mismatched += 1
            tally.jobs.setdefault(key, job_id)
        number += 1
        await asyncio.sleep(every_s)


@contextlib.contextmanager
def soak_stack(args: argparse.Namespace, log_dir: Path, webhook_url: str) -> Iterator[dict[str, Any]]:
    """Redis, the simulator and the gateway, each in a process of its own; stopped on the way out."""
    processes: dict[str, Process] = {}
    gateways: list[Process] = []
    client: redis.Redis | None = None
    try:  # whatever started is stopped, even when a later part fails to start
        redis_port, sim_port, gateway_port = free_port(), free_port(), free_port()
        redis_dir = log_dir / "redis"
        redis_dir.mkdir(exist_ok=True)
        processes["redis"] = spawn("redis", [
            shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(redis_port),
            "--bind", "127.0.0.1", "--dir", str(redis_dir), "--appendonly", "yes", "--save", "",
        ], log_dir)
        sim_url = f"http://127.0.0.1:{sim_port}"
        processes["simulator"] = spawn("simulator", [
            sys.executable, "-m", "cli.main", "engine-sim", "--port", str(sim_port),
            "--preset", "spark",
            "--time-scale", str(args.time_scale), "--error-rate", str(args.error_rate),
            "--slow-rate", str(args.slow_rate), "--slow-s", str(args.slow_s),
            "--cut-stream-rate", str(args.cut_stream_rate), "--malformed-rate", str(args.malformed_rate),
        ], log_dir)
        wait_until_ready(f"{sim_url}/health", processes["simulator"].popen)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        client = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        gateway_env = {
            "MODGATE_ENGINE__URL": sim_url,
            "MODGATE_REDIS__URL": redis_url,
            "MODGATE_SERVER__LOG_LEVEL": "warning",
            "MODGATE_ENGINE__FIRST_TOKEN_TIMEOUT_S": str(args.first_token_timeout_s),
            "MODGATE_ADMISSION__QUEUE_SIZE": str(args.queue_size),
            "MODGATE_ADMISSION__QUEUE_TIMEOUT_S": "10",
            "MODGATE_JOBS__CLAIM_IDLE_S": "5",
            "MODGATE_JOBS__RETRY_WAIT_S": "0.5",
            "MODGATE_JOBS__MAX_ATTEMPTS": "10",
            "MODGATE_JOBS__WEBHOOK_SECRET": WEBHOOK_SECRET,
            "MODGATE_JOBS__WEBHOOK_ALLOWLIST": "127.0.0.1",
            # Real keyframes are almost all distinct; a small pool here would be served from the verdict
            # cache and spare the engine (and its faults) the work. Off unless asked for.
            "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "3600" if args.verdict_cache else "0",
        }

        def start_gateway() -> Process:
            command = [sys.executable, "-m", "cli.main", "serve", "--port", str(gateway_port)]
            gateway = spawn(f"gateway-{len(gateways)}", command, log_dir, gateway_env)
            gateways.append(gateway)
            wait_until_ready(f"{gateway_url}/readyz", gateway.popen)
            return gateway

        start_gateway()
        yield {"gateway_url": gateway_url, "sim_url": sim_url, "redis": client, "gateways": gateways,
               "start_gateway": start_gateway, "processes": processes}
    finally:
        for process in [*gateways, *processes.values()]:
            process.stop()
        if client is not None:
            client.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Drive the soak; answers the report."""
    log_dir = Path(tempfile.mkdtemp(prefix="modgate-soak-"))
    receiver = WebhookReceiver()
    rng = random.Random(args.seed)
    frames = [make_keyframe(LABELS[i % len(LABELS)], 640, 360, seed=i) for i in range(48)]
    tally = Tally()
    started = time.monotonic()
    kills: list[float] = []
    with soak_stack(args, log_dir, receiver.url) as stack:
        gateways: list[Process] = stack["gateways"]
        others: dict[str, Process] = stack["processes"]
        stop_at = started + args.duration
        limits = httpx.Limits(max_connections=args.clients + 8)
        async with httpx.AsyncClient(base_url=stack["gateway_url"], timeout=60, limits=limits) as client:

            async def sampler() -> None:
                killed = args.no_kill
                while time.monotonic() < stop_at:
                    for process in [*gateways, *others.values()]:
                        process.sample()
                    if not killed and time.monotonic() - started >= args.duration / 2:
                        killed = True
                        gateways[-1].stop(signal.SIGKILL)
                        kills.append(round(time.monotonic() - started, 1))
                        await asyncio.to_thread(stack["start_gateway"])
                    await asyncio.sleep(0.5)

            callers = [live_caller(client, tally, frames, stop_at, random.Random(rng.random()))
                       for _ in range(args.clients)]
            await asyncio.gather(sampler(), job_submitter(client, tally, frames, stop_at, args.job_every,
                                                          receiver.url, rng), *callers)
            load_s = time.monotonic() - started
            # Drain: every accepted job must finish; what has not within the drain time is lost.
            state: redis.Redis = stack["redis"]
            drain_deadline = time.monotonic() + args.drain_s

            def statuses() -> dict[str, str]:
                found = {job_id: state.hget(RedisJobStore.job_key(job_id), "status")
                         for job_id in tally.jobs.values()}
                return {
                    job_id: status.decode() if isinstance(status, bytes) else str(status or "missing")
                    for job_id, status in found.items()
                }

            while time.monotonic() < drain_deadline:
                final = statuses()
                if all(s in ("succeeded", "failed") for s in final.values()):
                    break
                for process in [*gateways, *others.values()]:
                    process.sample()
                await asyncio.sleep(0.5)
            final = statuses()
            await asyncio.sleep(3)  # the last webhooks
            completions = Counter(
                int(state.hget(RedisJobStore.job_key(job_id), "completions") or 0)
                for job_id in tally.jobs.values()
            )
            redis_peak = int(state.info("memory").get("used_memory_peak", 0))
    receiver.close()
    delivered = {job_id: n for job_id, n in receiver.deliveries.items() if job_id in final}
    unanswered = sum(v for k, v in tally.outcomes.items() if k.startswith("transport"))
    answered = sum(tally.outcomes.values()) - unanswered
    return {
        "duration_s": round(load_s, 1),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "gateway_kills_at_s": kills,
        "live": {
            "sent": tally.sent,
            "answered": answered,
            "unanswered_transport_errors": tally.sent - answered,
            "frames_verdicted": tally.frames_verdicted,
            "frames_per_min": round(tally.frames_verdicted / load_s * 60, 1),
            "bad_input_wrongly_accepted": tally.bad_input_wrongly_accepted,
            "outcomes": dict(tally.outcomes.most_common()),
        },
        "jobs": {
            "accepted": len(tally.jobs),
            "submit_outcomes": dict(tally.job_submit_outcomes.most_common()),
            "idempotent_replays_same_id": tally.replays_matching,
            "idempotent_replays_other_id": tally.replays_mismatched,
            "succeeded": sum(1 for s in final.values() if s == "succeeded"),
            "failed": sum(1 for s in final.values() if s == "failed"),
            "lost": sum(1 for s in final.values() if s not in ("succeeded", "failed")),
            "completions_per_job": {str(k): v for k, v in sorted(completions.items())},
            "webhooks_jobs_delivered": len(delivered),
            "webhooks_repeated_deliveries": sum(n - 1 for n in delivered.values()),
            "webhooks_bad_signatures": receiver.bad_signatures,
        },
        "peak_rss_mib": {
            **{g.name: round(g.peak_rss / 2**20, 1) for g in gateways},
            "simulator": round(others["simulator"].peak_rss / 2**20, 1),
            "redis_process": round(others["redis"].peak_rss / 2**20, 1),
            "redis_used_memory_peak": round(redis_peak / 2**20, 1),
        },
        "logs": str(log_dir),
    }


def print_report(report: dict[str, Any]) -> None:
    """The figures, readable."""
    live, jobs = report["live"], report["jobs"]
    print(f"soak: {report['duration_s']} s of load; gateway killed (SIGKILL) at "
          f"{report['gateway_kills_at_s']} s")
    print(f"live requests: {live['sent']} sent, {live['answered']} answered, "
          f"{live['unanswered_transport_errors']} without an answer (transport errors); "
          f"{live['frames_verdicted']} frames verdicted ({live['frames_per_min']}/min); "
          f"bad input wrongly accepted: {live['bad_input_wrongly_accepted']}")
    print("answers by kind:")
    for kind, count in live["outcomes"].items():
        print(f"  {count:7d}  {kind}")
    print(f"jobs: {jobs['accepted']} accepted, {jobs['succeeded']} succeeded, {jobs['failed']} failed, "
          f"{jobs['lost']} LOST; completions per job {jobs['completions_per_job']}; "
          f"idempotent replays: {jobs['idempotent_replays_same_id']} same id, "
          f"{jobs['idempotent_replays_other_id']} other id")
    print(f"job submissions by kind: {jobs['submit_outcomes']}")
    print(f"webhooks: {jobs['webhooks_jobs_delivered']} jobs delivered, "
          f"{jobs['webhooks_repeated_deliveries']} repeated deliveries, "
          f"{jobs['webhooks_bad_signatures']} bad signatures")
    print("peak memory (MiB): " + ", ".join(f"{k} {v}" for k, v in report["peak_rss_mib"].items()))
    print(f"logs: {report['logs']}")


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    parser.add_argument("--clients", type=int, default=12, help="closed-loop live callers")
    parser.add_argument("--job-every", type=float, default=2.0, help="seconds between job submissions")
    parser.add_argument("--time-scale", type=float, default=0.05, help="simulator pace (1 = the Spark's)")
    parser.add_argument("--error-rate", type=float, default=0.03)
    parser.add_argument("--slow-rate", type=float, default=0.03)
    parser.add_argument("--slow-s", type=float, default=4.0, help="delay of a slow answer's first token")
    parser.add_argument("--cut-stream-rate", type=float, default=0.03)
    parser.add_argument("--malformed-rate", type=float, default=0.03)
    parser.add_argument("--first-token-timeout-s", type=float, default=2.0)
    parser.add_argument("--queue-size", type=int, default=16)
    parser.add_argument("--drain-s", type=float, default=120.0, help="time for accepted jobs to finish")
    parser.add_argument("--no-kill", action="store_true", help="do not kill the gateway halfway")
    parser.add_argument("--verdict-cache", action="store_true", help="keep the verdict cache on")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if report["jobs"]["lost"] or report["live"]["bad_input_wrongly_accepted"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
