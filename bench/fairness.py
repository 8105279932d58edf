"""Two tenants on one engine: does a quiet tenant wait for a slot, or for a flooding tenant's backlog?

The simulator's Spark preset (8 slots) and modgate in front of it, each in a process of its own, fresh for
each queue discipline (``MODGATE_ADMISSION__FAIRNESS``): ``tenant`` (each tenant its weighted share of
engine work) and ``fifo`` (one shared queue, as before tenants were counted). Tenant A keeps ``--waiting``
requests waiting (a closed loop of waiting + 8 callers); once its backlog is built, tenant B sends one
keyframe at a time, ``--b-keyframes`` of them. Printed, at the Spark's pace:

- B's p95 and A's median end to end, and their ratio (target: B's p95 under a third of A's median);
- B alone (the same keyframes with nothing else running, on the ``tenant`` gateway first);
- total throughput (A + B keyframes finished per minute while B was sending) of each discipline, and the
  ratio tenant / fifo (target: within 5 %: fairness moves the wait, not the work).

Everyone asks with thinking on (the Spark's measured setting). Durations run at ``--time-scale`` and are
scaled back to the Spark's pace; the gateway's own time is real, so it is inflated by 1 / time scale.

    python -m bench.fairness [--time-scale 0.1] [--waiting 100] [--b-keyframes 20] [--fifo-b-keyframes 6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.capacity import frame_pool, percentile
from bench.cluster import RedisProcess, running
from bench.report import add_report_options, load_average, machine_load, publish
from bench.servers import gateway, simulator

KEYS = {"flood": "bench-key-tenant-a", "quiet": "bench-key-tenant-b"}
TENANT = {"flood": "A", "quiet": "B"}
MAX_INFLIGHT = 8


@dataclass
class Finished:
    """One keyframe's answer: who sent it, when it finished (real seconds) and its end to end (Spark s)."""

    tenant: str
    done: float
    e2e_s: float
    queue_s: float  # its wait for an engine slot (Spark seconds), as the gateway reports it


@dataclass
class Run:
    """What one queue discipline measured."""

    fairness: str
    b: list[float] = field(default_factory=list)  # B's end to end (Spark seconds)
    b_queue: list[float] = field(default_factory=list)  # B's wait for an engine slot
    a: list[float] = field(default_factory=list)  # A's end to end, finished while B was sending
    per_min: float = float("nan")  # A + B keyframes finished a minute (Spark pace) while B was sending
    errors: int = 0

    def figures(self) -> dict[str, float]:
        """B's p50 / p95, A's median, their ratio and throughput."""
        return {
            "b_keyframes": float(len(self.b)),
            "b_p50_s": percentile(self.b, 50),
            "b_p95_s": percentile(self.b, 95),
            "b_queue_p50_s": percentile(self.b_queue, 50),
            "b_queue_p95_s": percentile(self.b_queue, 95),
            "a_keyframes": float(len(self.a)),
            "a_median_s": statistics.median(self.a) if self.a else float("nan"),
            "b_p95_over_a_median": (
                percentile(self.b, 95) / statistics.median(self.a) if self.a else float("nan")
            ),
            "throughput_per_min": self.per_min,
            "errors": float(self.errors),
        }


def body(url: str) -> bytes:
    return json.dumps({"model": "modgate-moderation",
                       "input": [{"type": "image_url", "image_url": {"url": url}}]}).encode()


async def post(http: httpx.AsyncClient, who: str, payload: bytes, time_scale: float) -> Finished | None:
    """One keyframe as tenant ``who``; None when it was not answered 200."""
    headers = {"Authorization": f"Bearer {KEYS[who]}", "X-Modgate-Thinking": "on",
               "Content-Type": "application/json"}
    sent = time.monotonic()
    try:
        response = await http.post("/v1/moderations", content=payload, headers=headers)
    except httpx.HTTPError:
        return None
    done = time.monotonic()
    if response.status_code != 200:
        return None
    queue_s = response.json()["results"][0]["modgate"]["queue_ms"] / 1000
    return Finished(who, done, (done - sent) / time_scale, queue_s / time_scale)


async def quiet_one_at_a_time(http: httpx.AsyncClient, payloads: list[bytes], count: int,
                              time_scale: float) -> tuple[list[Finished], int]:
    """B: ``count`` keyframes, each sent when the previous one is answered."""
    answers: list[Finished] = []
    errors = 0
    for index in range(count):
        answer = await post(http, "quiet", payloads[index % len(payloads)], time_scale)
        if answer is None:
            errors += 1
        else:
            answers.append(answer)
    return answers, errors


async def measure(url: str | tuple[str, str], fairness: str, args: argparse.Namespace, payloads: list[bytes],
                  alone: list[float] | None) -> Run:
    """B alone (if asked), then A's flood with B one keyframe at a time (``url``: one gateway, or A's and
    B's gateways on one Redis)."""
    run = Run(fairness)
    flood_url, quiet_url = (url, url) if isinstance(url, str) else url
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=flood_url, timeout=3600, limits=limits) as flood_http, \
            httpx.AsyncClient(base_url=quiet_url, timeout=3600, limits=limits) as http:
        await quiet_one_at_a_time(http, payloads[-2:], 2, args.time_scale)  # warm-up: model id, /tokenize
        if alone is not None:
            answers, _ = await quiet_one_at_a_time(http, payloads, args.alone_keyframes, args.time_scale)
            alone.extend(answer.e2e_s for answer in answers)
        finished: list[Finished] = []
        stop = asyncio.Event()
        flood_errors = 0

        async def flood_caller(offset: int) -> None:
            nonlocal flood_errors
            index = offset
            while not stop.is_set():
                answer = await post(flood_http, "flood", payloads[index % len(payloads)], args.time_scale)
                index += args.waiting + MAX_INFLIGHT
                if answer is None:
                    flood_errors += 1
                else:
                    finished.append(answer)

        callers = [asyncio.create_task(flood_caller(i)) for i in range(args.waiting + MAX_INFLIGHT)]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # A's backlog built: its callers are all in the queue
            if (await flood_http.get("/stats")).json()["queued"] >= args.waiting - 2:
                break
            await asyncio.sleep(0.05)
        count = args.fifo_b_keyframes if fairness in ("fifo", "first asks") else args.b_keyframes
        started = time.monotonic()
        answers, run.errors = await quiet_one_at_a_time(http, payloads, count, args.time_scale)
        ended = time.monotonic()
        stop.set()
        for caller in callers:
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
    run.b = [answer.e2e_s for answer in answers]
    run.b_queue = [answer.queue_s for answer in answers]
    during = [f for f in finished if started <= f.done <= ended]
    run.a = [f.e2e_s for f in during]
    run.per_min = (len(during) + len(answers)) / ((ended - started) / args.time_scale) * 60
    run.errors += flood_errors
    return run


def _env(fairness: str) -> dict[str, str]:
    return {
        "MODGATE_AUTH__API_KEYS": f"{KEYS['flood']}:tenant-a,{KEYS['quiet']}:tenant-b",
        "MODGATE_ADMISSION__FAIRNESS": fairness,
        "MODGATE_ADMISSION__QUEUE_SIZE": "1024",
        "MODGATE_ADMISSION__QUEUE_TIMEOUT_S": "3600",
        "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0",  # every keyframe goes to the engine
        "MODGATE_ENGINE__MAX_INFLIGHT": str(MAX_INFLIGHT),
    }


@contextlib.contextmanager
def stack(fairness: str, time_scale: float) -> Iterator[str]:
    """A fresh Spark simulator and a gateway with the two tenants' keys and the given queue discipline."""
    with simulator("spark", time_scale) as engine_url, gateway(engine_url, **_env(fairness)) as url:
        yield url


@contextlib.contextmanager
def replicated_stack(fair_share: bool, time_scale: float) -> Iterator[tuple[str, str]]:
    """A fresh simulator, a private Redis and two gateways on it (the cap of 8 held across both by the
    leases): A's flood goes to the first, B's keyframes to the second. ``fair_share``: the next free slot
    goes to the tenant served least across both (``MODGATE_LEASES__FAIR_SHARE``); off: to whichever
    replica asks first, as before."""
    env = {**_env("tenant"), "MODGATE_LEASES__FAIR_SHARE": "true" if fair_share else "false"}
    with tempfile.TemporaryDirectory(prefix="modgate-fairness-") as tmp, \
            running(store := RedisProcess(Path(tmp)).start()), simulator("spark", time_scale) as engine_url, \
            gateway(engine_url, MODGATE_REDIS__URL=store.url, **env) as a, \
            gateway(engine_url, MODGATE_REDIS__URL=store.url, **env) as b:
        yield a, b


def run_replicated(args: argparse.Namespace) -> dict[str, Any]:
    """Across two replicas: fair leases on, then off (the replica that asks first), B alone first."""
    payloads = [body(url) for url in frame_pool(args.frame_pool)]
    report: dict[str, Any] = {
        "setup": {"time_scale": args.time_scale, "waiting": args.waiting, "b_keyframes": args.b_keyframes,
                  "replicas": 2, "alone_keyframes": args.alone_keyframes, "cpus": os.cpu_count(),
                  "load_before": load_average()},
        "runs": {},
    }
    alone: list[float] = []
    for name, fair_share in (("fair leases", True), ("first asks", False)):
        print(f"{name}: A keeps {args.waiting} waiting on replica 1, B one keyframe at a time on replica 2",
              flush=True)
        with replicated_stack(fair_share, args.time_scale) as urls:
            measured = asyncio.run(measure(urls, name, args, payloads, alone if fair_share else None))
        report["runs"][name] = measured.figures()
    report["alone"] = {"b_keyframes": len(alone), "b_p50_s": percentile(alone, 50),
                       "b_p95_s": percentile(alone, 95)}
    fair, first = report["runs"]["fair leases"], report["runs"]["first asks"]
    report["ratios"] = {
        "tenant_b_p95_over_a_median": fair["b_p95_over_a_median"],
        "fifo_b_p95_over_a_median": first["b_p95_over_a_median"],
        "tenant_b_p95_over_alone": fair["b_p95_s"] / report["alone"]["b_p95_s"],
        "fifo_b_p50_over_alone": first["b_p50_s"] / report["alone"]["b_p50_s"],
        "throughput_tenant_over_fifo": fair["throughput_per_min"] / first["throughput_per_min"],
    }
    report["setup"]["load_after"] = load_average()
    return report


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both disciplines, one after the other, with B alone measured first."""
    payloads = [body(url) for url in frame_pool(args.frame_pool)]
    report: dict[str, Any] = {
        "setup": {"time_scale": args.time_scale, "waiting": args.waiting, "b_keyframes": args.b_keyframes,
                  "fifo_b_keyframes": args.fifo_b_keyframes, "alone_keyframes": args.alone_keyframes,
                  "cpus": os.cpu_count(), "load_before": load_average()},
        "runs": {},
    }
    alone: list[float] = []
    for fairness in ("tenant", "fifo"):
        print(f"{fairness}: A keeps {args.waiting} waiting, B one keyframe at a time ...", flush=True)
        with stack(fairness, args.time_scale) as url:
            first = alone if fairness == "tenant" else None  # B alone: before the first flood
            measured = asyncio.run(measure(url, fairness, args, payloads, first))
        report["runs"][fairness] = measured.figures()
    report["alone"] = {"b_keyframes": len(alone), "b_p50_s": percentile(alone, 50),
                       "b_p95_s": percentile(alone, 95)}
    fair, fifo = report["runs"]["tenant"], report["runs"]["fifo"]
    report["ratios"] = {
        "tenant_b_p95_over_a_median": fair["b_p95_over_a_median"],
        "fifo_b_p95_over_a_median": fifo["b_p95_over_a_median"],
        "tenant_b_p95_over_alone": fair["b_p95_s"] / report["alone"]["b_p95_s"],
        "fifo_b_p50_over_alone": fifo["b_p50_s"] / report["alone"]["b_p50_s"],
        "throughput_tenant_over_fifo": fair["throughput_per_min"] / fifo["throughput_per_min"],
    }
    report["setup"]["load_after"] = load_average()
    return report


def print_report(report: dict[str, Any]) -> None:
    """The table and the ratios against the targets."""
    alone = report["alone"]
    print(f"\n{'queue':<8}{'B p50 (s)':>11}{'B p95 (s)':>11}{'B wait p95':>12}{'A median (s)':>14}"
          f"{'B p95 / A med':>15}{'keyframes/min':>15}{'B n':>6}{'A n':>6}{'errors':>8}")
    for name, row in report["runs"].items():
        print(f"{name:<8}{row['b_p50_s']:>11.2f}{row['b_p95_s']:>11.2f}{row['b_queue_p95_s']:>12.2f}"
              f"{row['a_median_s']:>14.2f}"
              f"{row['b_p95_over_a_median']:>15.3f}{row['throughput_per_min']:>15.1f}"
              f"{row['b_keyframes']:>6.0f}{row['a_keyframes']:>6.0f}{row['errors']:>8.0f}")
    print(f"{'B alone':<8}{alone['b_p50_s']:>11.2f}{alone['b_p95_s']:>11.2f}")
    ratios = report["ratios"]
    fair, other = list(report["runs"])  # tenant / fifo; across replicas: fair leases / first asks
    print(f"\nB's p95 / A's median, {fair}: {ratios['tenant_b_p95_over_a_median']:.3f} (target < 0.333); "
          f"{other}: {ratios['fifo_b_p95_over_a_median']:.3f}")
    print(f"B's p95 under the flood / B alone, {fair}: {ratios['tenant_b_p95_over_alone']:.2f}; "
          f"B's median under the flood / alone, {other}: {ratios['fifo_b_p50_over_alone']:.2f}")
    print(f"throughput {fair} / {other}: {ratios['throughput_tenant_over_fifo']:.3f} (target 0.95-1.05)")
    setup = report["setup"]
    print(f"load average before {setup['load_before']}, after {setup['load_after']} on {setup['cpus']} CPUs")


def print_markdown(report: dict[str, Any]) -> None:
    """The table in Markdown, for docs/tenants.md."""
    alone = report["alone"]
    print("\n| queue | B p50 (s) | B p95 (s) | B slot wait p95 (s) | A median (s) | B p95 / A median | "
          "keyframes/min (A + B) |\n| --- | --- | --- | --- | --- | --- | --- |")
    for name, row in report["runs"].items():
        print(f"| `{name}` | {row['b_p50_s']:.2f} | {row['b_p95_s']:.2f} | {row['b_queue_p95_s']:.2f} | "
              f"{row['a_median_s']:.1f} | "
              f"{row['b_p95_over_a_median']:.3f} | {row['throughput_per_min']:.1f} |")
    print(f"| B alone | {alone['b_p50_s']:.2f} | {alone['b_p95_s']:.2f} | – | – | – | – |")


def main(argv: list[str] | None = None) -> None:
    """Print the fairness table (and write it as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--waiting", type=int, default=100, help="requests tenant A keeps waiting")
    parser.add_argument("--b-keyframes", type=int, default=20, help="B's keyframes under tenant fairness")
    parser.add_argument("--fifo-b-keyframes", type=int, default=6,
                        help="B's keyframes under fifo (each waits for A's whole backlog)")
    parser.add_argument("--alone-keyframes", type=int, default=10, help="B's keyframes with nothing else")
    parser.add_argument("--frame-pool", type=int, default=48, help="distinct keyframes to draw from")
    parser.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                        help="2: A's flood on one replica, B on another, on one Redis (fair leases on / off)")
    add_report_options(parser)
    args = parser.parse_args(argv)
    print(f"simulator spark preset at time scale {args.time_scale:g} (figures at the Spark's pace); "
          f"{machine_load()}", flush=True)
    publish(run(args) if args.replicas == 1 else run_replicated(args), args, print_report, print_markdown)


if __name__ == "__main__":
    main()
