"""A rolling restart behind a real load balancer: does any caller notice, is any job lost, does the cap hold?

Real parts, each in a process of its own: a private ``redis-server``, the engine simulator (Spark preset,
``--max-num-seqs`` 64 so that it would run more than 8 at once if it were sent more: its ``peak_requests``
is then the most requests the gateways had at the engine together), ``--replicas`` gateways sharing the
Redis (cap 8 held across them by the leases, ``MODGATE_SERVER__DRAIN_S`` 3), and Debian's HAProxy in front,
health-checking ``/readyz`` every 250 ms (two failed checks take a replica out). Steady traffic goes through
HAProxy: ``--clients`` callers with the
official ``openai`` client (``max_retries=0``: a failure is counted, never retried away) and one job every
``--job-every-s`` seconds. Then every replica is restarted in turn (SIGTERM, wait for its exit, start it
again on its port, wait until HAProxy has it UP again), and the traffic runs on for ``--tail-s``.

Printed: requests sent / answered / failed, jobs submitted / succeeded / lost / completed twice, the most
requests at the engine at once, and per restart the seconds until HAProxy took the replica out, until it
exited (and its exit status) and until it was back in rotation.

    python -m bench.rolling [--replicas 2] [--clients 12] [--time-scale 0.1] [--json F] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import redis
from openai.types import ModerationImageURLInputParam

from bench.cluster import HAProxy, RedisProcess, Replica, running
from bench.report import add_report_options, load_average, machine_load, publish
from bench.servers import simulator
from deploy.keyframes import make_keyframe
from gateway.jobs.store_redis import RedisJobStore

CAP = 8
API_KEY = "rolling-bench-key"


@dataclass
class Tally:
    """What the callers saw (shared by their threads)."""

    answered: int = 0
    failures: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    job_failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _frames(count: int) -> list[str]:
    return [f"data:image/jpeg;base64,{b64encode(make_keyframe('allow', 320, 180, seed=500 + i)).decode()}"
            for i in range(count)]


def _caller(url: str, frames: list[str], offset: int, stop: threading.Event, tally: Tally) -> None:
    """One caller: a keyframe, its answer, the next keyframe, until ``stop``."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    index = offset
    while not stop.is_set():
        frame = frames[index % len(frames)]
        index += 7
        try:
            part: ModerationImageURLInputParam = {"type": "image_url", "image_url": {"url": frame}}
            client.moderations.create(model="modgate-moderation", input=[part])
        except openai.APIStatusError as exc:
            with tally.lock:
                tally.failures.append(
                    f"{time.strftime('%H:%M:%S')} {exc.status_code}: {exc.response.text}"[:300]
                )
        except openai.OpenAIError as exc:
            with tally.lock:
                tally.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}"[:300])
        else:
            with tally.lock:
                tally.answered += 1
    client.close()


def _job_submitter(url: str, frames: list[str], every_s: float, stop: threading.Event, tally: Tally) -> None:
    """A job of two keyframes every ``every_s`` seconds (no retry: a failed submission is counted)."""
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        number = 0
        while not stop.wait(every_s):
            number += 1
            parts = [{"type": "image_url", "image_url": {"url": frames[(number * 2 + i) % len(frames)]}}
                     for i in range(2)]
            try:
                answer = http.post("/v1/jobs", json={"video_id": f"rolling-{number}", "frames": parts},
                                   headers={"Idempotency-Key": f"rolling-{number}"})
            except httpx.HTTPError as exc:
                tally.job_failures.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            if answer.status_code != 202:
                tally.job_failures.append(f"{answer.status_code}: {answer.text[:200]}")
            else:
                tally.jobs.append(answer.json()["id"])


def _job_outcomes(redis_url: str, ids: list[str], timeout_s: float) -> dict[str, int]:
    """Wait until every job has finished (or ``timeout_s``): succeeded, lost (unfinished), completed twice."""
    state = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            records = [state.hgetall(RedisJobStore.job_key(job_id)) for job_id in ids]
            succeeded = sum(record.get(b"status") == b"succeeded" for record in records)
            if succeeded == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return {
            "submitted": len(ids),
            "succeeded": succeeded,
            "lost": len(ids) - succeeded,
            "completed_twice": sum(int(record.get(b"completions", b"0")) > 1 for record in records),
            "worked_again": sum(int(record.get(b"attempts", b"0")) > 1 for record in records),
        }
    finally:
        state.close()


@contextlib.contextmanager
def fleet(
    replicas: int, time_scale: float, directory: Path
) -> Iterator[tuple[HAProxy, list[Replica], str, str]]:
    """Redis, the simulator, the replicas and HAProxy, all ready; yields them, the engine's, Redis's URL."""
    store = RedisProcess(directory / "redis").start()
    with running(store), simulator("spark", time_scale, "--max-num-seqs", "64") as engine_url:
        env = {
            "MODGATE_ENGINE__URL": engine_url,
            "MODGATE_REDIS__URL": store.url,
            "MODGATE_AUTH__API_KEYS": f"{API_KEY}:rolling",
            "MODGATE_ENGINE__MAX_INFLIGHT": str(CAP),
            "MODGATE_SERVER__DRAIN_S": "3",  # HAProxy takes a 503 out within 0.5 s, well before the drain
            "MODGATE_JOBS__STOP_GRACE_S": "5",
            "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0",  # every keyframe goes to the engine
            "MODGATE_ADMISSION__QUEUE_TIMEOUT_S": "120",
            # A replica starved of CPU (a neighbour importing the gateway on 2 busy cores) misses the 0.5 s
            # lease deadline and serves on its local cap for 5 s, as if Redis were down: give it 2 s here.
            "MODGATE_LEASES__REDIS_TIMEOUT_S": "2",
        }
        gateways = [Replica(f"gateway-{i}", env, directory / "logs") for i in range(replicas)]
        balancer = HAProxy(gateways, directory / "haproxy")
        with running(*gateways):
            for gateway in gateways:
                gateway.spawn()
            for gateway in gateways:
                gateway.wait_ready()
            with running(balancer.start()):
                for gateway in gateways:
                    balancer.wait_state(gateway.name, "UP")
                yield balancer, gateways, engine_url, store.url


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One rolling restart under traffic; the figures."""
    report: dict[str, Any] = {"setup": {
        "replicas": args.replicas, "clients": args.clients, "time_scale": args.time_scale, "cap": CAP,
        "job_every_s": args.job_every_s, "load_before": load_average(),
    }}
    frames = _frames(32)
    tally = Tally()
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="modgate-rolling-") as tmp, \
            fleet(args.replicas, args.time_scale, args.work_dir or Path(tmp)) as (
                balancer, gateways, engine_url, redis_url):
        threads = [threading.Thread(target=_caller, args=(balancer.url, frames, i, stop, tally), daemon=True)
                   for i in range(args.clients)]
        threads.append(threading.Thread(
            target=_job_submitter, args=(balancer.url, frames, args.job_every_s, stop, tally), daemon=True
        ))
        for thread in threads:
            thread.start()
        time.sleep(args.warmup_s)
        restarts = []
        for gateway in gateways:
            started = time.monotonic()
            gateway.signal_term()
            out_s = balancer.wait_state(gateway.name, "DOWN")
            code = gateway.wait_exit()
            exited_s = time.monotonic() - started
            gateway.spawn()
            gateway.wait_ready()
            balancer.wait_state(gateway.name, "UP")
            restarts.append({"replica": gateway.name, "out_of_rotation_s": round(out_s, 3),
                             "exited_s": round(exited_s, 2), "exit_status": code,
                             "back_in_rotation_s": round(time.monotonic() - started, 2)})
        time.sleep(args.tail_s)
        stop.set()
        for thread in threads:
            thread.join(180)
        jobs = _job_outcomes(redis_url, tally.jobs, args.jobs_timeout_s)
        peak = httpx.get(f"{engine_url}/sim/info", timeout=10).json()["peak_requests"]
    report["requests"] = {"sent": tally.answered + len(tally.failures), "answered": tally.answered,
                          "failed": len(tally.failures), "first_failures": tally.failures[:5]}
    report["jobs"] = {**jobs, "submissions_failed": len(tally.job_failures),
                      "first_submission_failures": tally.job_failures[:5]}
    report["engine"] = {"peak_requests": peak, "cap": CAP, "cap_exceeded": peak > CAP}
    report["restarts"] = restarts
    report["setup"]["load_after"] = load_average()
    return report


def print_report(report: dict[str, Any]) -> None:
    """The run's figures."""
    requests, jobs, engine = report["requests"], report["jobs"], report["engine"]
    print(f"\nrequests: {requests['sent']} sent, {requests['answered']} answered, "
          f"{requests['failed']} failed")
    for failure in requests["first_failures"]:
        print(f"  {failure}")
    print(f"jobs: {jobs['submitted']} submitted ({jobs['submissions_failed']} submissions failed), "
          f"{jobs['succeeded']} succeeded, {jobs['lost']} lost, {jobs['completed_twice']} completed twice, "
          f"{jobs['worked_again']} worked again after a stop")
    print(f"engine: at most {engine['peak_requests']} requests at once (cap {engine['cap']})")
    print(f"\n{'replica':<12}{'out of rotation (s)':>21}{'exited (s)':>12}{'status':>8}{'back (s)':>10}")
    for row in report["restarts"]:
        print(f"{row['replica']:<12}{row['out_of_rotation_s']:>21.2f}{row['exited_s']:>12.2f}"
              f"{row['exit_status']:>8}{row['back_in_rotation_s']:>10.2f}")
    setup = report["setup"]
    print(f"load average before {setup['load_before']}, after {setup['load_after']}")


def print_markdown(report: dict[str, Any]) -> None:
    """The run in Markdown, for docs/reliability.md."""
    requests, jobs, engine = report["requests"], report["jobs"], report["engine"]
    print("\n| requests sent | failed | jobs submitted | jobs lost | completed twice | engine peak (cap) |\n"
          "| --- | --- | --- | --- | --- | --- |")
    print(f"| {requests['sent']} | {requests['failed']} | {jobs['submitted']} | {jobs['lost']} | "
          f"{jobs['completed_twice']} | {engine['peak_requests']} ({engine['cap']}) |")
    print("\n| replica | out of rotation (s) | exited (s) | exit status | back in rotation (s) |\n"
          "| --- | --- | --- | --- | --- |")
    for row in report["restarts"]:
        print(f"| {row['replica']} | {row['out_of_rotation_s']:.2f} | {row['exited_s']:.2f} | "
              f"{row['exit_status']} | {row['back_in_rotation_s']:.2f} |")


def options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (also what the test passes, smaller)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--clients", type=int, default=12, help="openai callers, one keyframe at a time each")
    parser.add_argument("--time-scale", type=float, default=0.1, help="the simulator's pace (1: the Spark's)")
    parser.add_argument("--job-every-s", type=float, default=0.5)
    parser.add_argument("--warmup-s", type=float, default=3.0, help="traffic before the first restart")
    parser.add_argument("--tail-s", type=float, default=3.0, help="traffic after the last restart")
    parser.add_argument("--jobs-timeout-s", type=float, default=180.0)
    parser.add_argument("--work-dir", type=Path, help="keep the logs and configuration here")
    add_report_options(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Print the rolling restart's figures (and write them as JSON with ``--json``)."""
    args = options(argv)
    print(f"rolling restart of {args.replicas} replicas behind HAProxy; {machine_load()}", flush=True)
    publish(run(args), args, print_report, print_markdown)


if __name__ == "__main__":
    main()
