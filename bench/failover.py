"""Redis behind Sentinel, its primary killed under load: what stops, for how long, and what is lost?

Real parts, each in a process of its own: a Redis primary, two replicas and three sentinels
(``redis-server --sentinel``, ``down-after-milliseconds`` 1000), the engine simulator (Spark preset,
``--max-num-seqs`` 64, so its ``running + waiting`` is the requests the gateways have at it), and two
gateways on ``MODGATE_REDIS__URL=redis+sentinel://…`` with ``MODGATE_JOBS__WAIT_REPLICAS`` 1. While callers
(the official ``openai`` client, no retries), a job submitter (retrying a refused submission with its
Idempotency-Key) and a policy flipper (alternating the two gateways) run, the primary gets SIGKILL. No
verdict is reused (``MODGATE_SHAPING__VERDICT_CACHE_TTL_S`` 0), so every request takes an engine slot.

The timeline, in seconds after the kill: when the sentinels named the new primary, the first policy flip
asked after that which succeeded, the first engine lease on the new primary, when every gateway held the
cap through Redis again (``modgate_engine_leases_local_only`` back to 0 and no call admitted on a local cap
still running: ``modgate_engine_calls_outside_shared_cap`` 0; the cap is judged from then on). Also: requests
failed before / after the kill, jobs accepted / lost / completed twice, the most requests at the engine
during the switch and after it, and whether the gateways converged on one policy version.

    python -m bench.failover [--clients 8] [--time-scale 0.1] [--after-s 20] [--json F] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import threading
import time
from base64 import b64encode
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import redis
from openai.types import ModerationImageURLInputParam

from bench.capacity import ADMIN_TOKEN
from bench.cluster import Replica, SentinelFleet, running
from bench.report import add_report_options, load_average, machine_load, publish
from bench.servers import simulator
from deploy.keyframes import make_keyframe
from gateway.jobs.store_redis import RedisJobStore

CAP = 8
API_KEY = "failover-bench-key"
LEASE_PREFIX = "modgate:engine-leases"
SETTLE_S = 1.0  # after the last call admitted on a local cap finished: the engine's count catches up


@dataclass
class Timeline:
    """Events the threads saw, as (monotonic time, what) pairs, shared by the threads."""

    requests: list[tuple[float, bool]] = field(default_factory=list)
    flips: list[tuple[float, bool]] = field(default_factory=list)
    engine: list[tuple[float, int]] = field(default_factory=list)  # requests at the engine
    local_only: list[tuple[float, bool]] = field(default_factory=list)  # any gateway on local caps
    jobs: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _frames(count: int) -> list[str]:
    return [f"data:image/jpeg;base64,{b64encode(make_keyframe('allow', 320, 180, seed=700 + i)).decode()}"
            for i in range(count)]


def _caller(urls: list[str], frames: list[str], offset: int, stop: threading.Event, seen: Timeline) -> None:
    clients = [openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
               for url in urls]
    index = offset
    while not stop.is_set():
        part: ModerationImageURLInputParam = {"type": "image_url",
                                              "image_url": {"url": frames[index % len(frames)]}}
        client = clients[index % len(clients)]
        index += 1
        started = time.monotonic()  # a request counts from when it was sent
        try:
            client.moderations.create(model="modgate-moderation", input=[part])
            ok = True
        except openai.OpenAIError:
            ok = False
        with seen.lock:
            seen.requests.append((started, ok))
    for client in clients:
        client.close()


def _submitter(urls: list[str], frames: list[str], stop: threading.Event, seen: Timeline) -> None:
    """A job every 0.3 s; a refused submission is sent again with the same Idempotency-Key until accepted."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(timeout=30, headers=headers) as http:
        number = 0
        while not stop.wait(0.3):
            number += 1
            parts = [{"type": "image_url", "image_url": {"url": frames[(number + i) % len(frames)]}}
                     for i in range(2)]
            body = {"video_id": f"failover-{number}", "frames": parts}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                url = urls[number % len(urls)]
                with contextlib.suppress(httpx.HTTPError):
                    answer = http.post(f"{url}/v1/jobs", json=body,
                                       headers={"Idempotency-Key": f"failover-{number}"})
                    if answer.status_code == 202:
                        with seen.lock:
                            seen.jobs.append(answer.json()["id"])
                        break
                time.sleep(0.2)


def _flipper(urls: list[str], stop: threading.Event, seen: Timeline) -> None:
    """The thinking policy's default mode, flipped every 0.25 s on alternate gateways."""
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        number = 0
        while not stop.wait(0.25):
            number += 1
            url = urls[number % len(urls)]
            ok = False
            started = time.monotonic()  # a flip counts from when it was asked
            with contextlib.suppress(httpx.HTTPError):
                current = http.get(f"{url}/admin/thinking-policy").json()
                document = {key: value for key, value in current.items()
                            if key not in ("version", "content_hash", "store")}
                document["default_mode"] = "off" if current["default_mode"] == "on" else "on"
                answer = http.put(f"{url}/admin/thinking-policy",
                                  json={**document, "reason": f"failover bench flip {number}"})
                ok = answer.status_code == 200
            with seen.lock:
                seen.flips.append((started, ok))


def _sampler(engine_url: str, urls: list[str], stop: threading.Event, seen: Timeline) -> None:
    """Every 50 ms: requests at the engine, and whether any gateway holds the cap on its own."""
    with httpx.Client(timeout=5) as http:
        while not stop.wait(0.05):
            with contextlib.suppress(httpx.HTTPError, KeyError):
                info = http.get(f"{engine_url}/sim/info").json()
                seen.engine.append((time.monotonic(), int(info["running"]) + int(info["waiting"])))
            local = False
            for url in urls:
                with contextlib.suppress(httpx.HTTPError):
                    local |= _on_local_caps(http.get(f"{url}/metrics").text)
            seen.local_only.append((time.monotonic(), local))


def _on_local_caps(metrics: str) -> bool:
    """Whether a gateway's ``/metrics`` says it holds the cap alone, or still runs calls admitted so."""
    flag = re.search(r"^modgate_engine_leases_local_only (\S+)$", metrics, re.MULTILINE)
    calls = re.search(r"^modgate_engine_calls_outside_shared_cap (\S+)$", metrics, re.MULTILINE)
    return any(match is not None and float(match.group(1)) > 0 for match in (flag, calls))


def _new_lease(fleet: SentinelFleet, engine_url: str, killed_port: int, timeout_s: float) -> float | None:
    """When an engine lease the new primary did not inherit was first seen on it (monotonic), or None.

    A promoted replica carries the old primary's lease members over, so a member present there proves
    nothing: the first one that was not in the set at the first look was taken from the new primary.
    """
    deadline = time.monotonic() + timeout_s
    inherited: set[Any] | None = None
    while time.monotonic() < deadline:
        port = fleet.primary_port()
        if port is not None and port != killed_port:
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                members: set[Any] | None = set(client.zrange(f"{LEASE_PREFIX}:{engine_url}", 0, -1))
            except redis.RedisError:
                members = None
            finally:
                client.close()
            if members is not None:
                if inherited is None:
                    inherited = members
                elif members - inherited:
                    return time.monotonic()
        time.sleep(0.05)
    return None


def _shared_again(seen: Timeline, since: float, timeout_s: float, quiet_s: float = 1.0) -> float | None:
    """When every gateway held its leases through Redis again (monotonic): the sampler saw no gateway on
    local caps for ``quiet_s`` on end, after ``since``; None if that did not happen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with seen.lock:
            samples = [(t, on) for t, on in seen.local_only if t > since]
        last_local = max((t for t, on in samples if on), default=since)
        quiet = [t for t, on in samples if t > last_local]
        if quiet and quiet[-1] - last_local >= quiet_s:
            return last_local
        time.sleep(0.1)
    return None


def _jobs(url: str, ids: list[str], timeout_s: float) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            records = [client.hgetall(RedisJobStore.job_key(job_id)) for job_id in ids]
            succeeded = sum(record.get(b"status") == b"succeeded" for record in records)
            if succeeded == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return {"accepted": len(ids), "succeeded": succeeded, "lost": len(ids) - succeeded,
                "completed_twice": sum(int(r.get(b"completions", b"0")) > 1 for r in records)}
    finally:
        client.close()


def _versions(urls: list[str]) -> list[int]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    answers = [httpx.get(f"{url}/admin/thinking-policy", headers=headers, timeout=10) for url in urls]
    return [int(answer.json()["version"]) for answer in answers]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One failover under load; the timeline and the counts."""
    report: dict[str, Any] = {"setup": {"clients": args.clients, "time_scale": args.time_scale, "cap": CAP,
                                        "load_before": load_average()}}
    frames = _frames(24)
    seen = Timeline()
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="modgate-failover-") as tmp:
        directory = args.work_dir or Path(tmp)
        fleet = SentinelFleet(directory / "redis", replicas=2).start()
        with running(fleet), simulator("spark", args.time_scale, "--max-num-seqs", "64") as engine_url:
            env = {
                "MODGATE_ENGINE__URL": engine_url, "MODGATE_REDIS__URL": fleet.url,
                "MODGATE_AUTH__API_KEYS": f"{API_KEY}:failover", "MODGATE_AUTH__ADMIN_TOKEN": ADMIN_TOKEN,
                "MODGATE_ENGINE__MAX_INFLIGHT": str(CAP), "MODGATE_JOBS__WAIT_REPLICAS": "1",
                "MODGATE_ADMISSION__QUEUE_TIMEOUT_S": "120",
                # No verdict reused: every request takes an engine slot, so the cap after the switch is
                # exercised (with reuse on, the 24 frames are all stored within seconds and no lease is
                # asked for again).
                "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0",
            }
            gateways = [Replica(f"gateway-{i}", env, directory / "logs") for i in range(2)]
            with running(*gateways):
                for gateway in gateways:
                    gateway.spawn()
                for gateway in gateways:
                    gateway.wait_ready()
                urls = [gateway.url for gateway in gateways]
                threads = [threading.Thread(target=_caller, args=(urls, frames, i, stop, seen), daemon=True)
                           for i in range(args.clients)]
                threads += [
                    threading.Thread(target=_submitter, args=(urls, frames, stop, seen), daemon=True),
                    threading.Thread(target=_flipper, args=(urls, stop, seen), daemon=True),
                    threading.Thread(target=_sampler, args=(engine_url, urls, stop, seen), daemon=True),
                ]
                for thread in threads:
                    thread.start()
                time.sleep(args.before_s)
                old = fleet.primary()
                killed = time.monotonic()
                old.kill()
                promoted = None
                while time.monotonic() - killed < 60:
                    port = fleet.primary_port()
                    if port is not None and port != old.port:
                        promoted = time.monotonic()
                        break
                    time.sleep(0.05)
                lease = _new_lease(fleet, engine_url, old.port, 60)
                shared = _shared_again(seen, killed, 60)
                # The cap is judged once no gateway holds it alone and no call admitted so still runs.
                after_from = (shared if shared is not None else time.monotonic()) + SETTLE_S
                time.sleep(max(0.0, after_from - time.monotonic()) + args.after_s)
                stop.set()
                for thread in threads:
                    thread.join(180)
                new_primary = f"redis://127.0.0.1:{fleet.primary_port()}/0"
                report["jobs"] = _jobs(new_primary, seen.jobs, args.jobs_timeout_s)
                converged = None
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    versions = _versions(urls)
                    if len(set(versions)) == 1:
                        converged = versions[0]
                        break
                    time.sleep(0.2)
    report["timeline"] = _timeline(seen, killed, promoted, lease, shared, after_from)
    report["policy"] = {"flips_ok_after_kill": sum(ok for t, ok in seen.flips if t > killed),
                        "flips_failed_after_kill": sum(not ok for t, ok in seen.flips if t > killed),
                        "converged_version": converged}
    report["setup"]["load_after"] = load_average()
    return report


def _timeline(seen: Timeline, killed: float, promoted: float | None, lease: float | None,
              shared: float | None, after_from: float) -> dict[str, Any]:
    def after(moment: float | None) -> float | None:
        return None if moment is None else round(moment - killed, 2)

    first_flip = next((t for t, ok in seen.flips if ok and t > (promoted or killed)), None)
    return {
        "new_primary_s": after(promoted),
        "first_flip_s": after(first_flip),
        "first_lease_s": after(lease),
        "local_caps_until_s": after(shared),
        "cap_judged_from_s": after(after_from),
        "engine_peak_before": max((n for t, n in seen.engine if t < killed), default=0),
        "engine_peak_switch": max((n for t, n in seen.engine if killed <= t <= after_from), default=0),
        "engine_peak_after": max((n for t, n in seen.engine if t > after_from), default=0),
        "engine_samples_after": sum(1 for t, _ in seen.engine if t > after_from),
        "requests_before": sum(1 for t, _ in seen.requests if t < killed),
        "requests_failed_before": sum(not ok for t, ok in seen.requests if t < killed),
        "requests_after": sum(1 for t, _ in seen.requests if t >= killed),
        "requests_failed_after": sum(not ok for t, ok in seen.requests if t >= killed),
    }


def print_report(report: dict[str, Any]) -> None:
    """The timeline and the counts."""
    line, jobs, policy = report["timeline"], report["jobs"], report["policy"]
    print(f"\nprimary killed at 0 s; new primary named at {line['new_primary_s']} s; first flip after it "
          f"{line['first_flip_s']} s; first lease on it {line['first_lease_s']} s; every gateway on shared "
          f"caps again from {line['local_caps_until_s']} s")
    print(f"requests: before {line['requests_before']} ({line['requests_failed_before']} failed), after "
          f"{line['requests_after']} ({line['requests_failed_after']} failed)")
    print(f"jobs: {jobs['accepted']} accepted, {jobs['succeeded']} succeeded, {jobs['lost']} lost, "
          f"{jobs['completed_twice']} completed twice")
    print(f"engine at most: before {line['engine_peak_before']}, switch {line['engine_peak_switch']}, "
          f"after {line['engine_peak_after']} (cap {CAP})")
    print(f"policy: {policy['flips_ok_after_kill']} flips ok after the kill, "
          f"{policy['flips_failed_after_kill']} refused; gateways converged on version "
          f"{policy['converged_version']}")
    setup = report["setup"]
    print(f"load average before {setup['load_before']}, after {setup['load_after']}")


def print_markdown(report: dict[str, Any]) -> None:
    """The timeline in Markdown, for docs/reliability.md."""
    line = report["timeline"]
    print("\n| event | seconds after the kill |\n| --- | --- |")
    for name, key in (("sentinels name the new primary", "new_primary_s"),
                      ("first policy flip that succeeds", "first_flip_s"),
                      ("first engine lease on the new primary", "first_lease_s"),
                      ("last gateway back on shared caps", "local_caps_until_s")):
        print(f"| {name} | {line[key]} |")


def options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (also what the test passes)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--before-s", type=float, default=8.0)
    parser.add_argument("--after-s", type=float, default=15.0)
    parser.add_argument("--jobs-timeout-s", type=float, default=120.0)
    parser.add_argument("--work-dir", type=Path, help="keep the logs here")
    add_report_options(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Print the failover's timeline (and write it as JSON with ``--json``)."""
    args = options(argv)
    print(f"Redis primary killed behind Sentinel under load; {machine_load()}", flush=True)
    publish(run(args), args, print_report, print_markdown)


if __name__ == "__main__":
    main()
