"""Soak with faults: real parts, a steady mix of work, one fault at a time, and invariants checked at the end.

The fleet (``bench.soak_parts``), each part a process of its own on this machine: two gateway replicas
behind HAProxy, Redis behind Sentinel (a primary, a replica, three sentinels; the gateways on
``redis+sentinel://``), two simulated engines (``modgate engine-sim``: one on vLLM's wire, one on
llama-server's; caps 4 and 2), and a webhook receiver in this process. For ``--duration`` seconds it drives:

- live keyframes from two tenants with equal weights, ``--clients-a`` and ``--clients-b`` callers each at
  most ``--rate`` calls a second (more than the engines' 6 slots, so both keep calls waiting), a share of
  them bad input that must get its 4xx;
- a job every ``--job-every`` seconds, tenants in turn, every third a 3-second video the gateway cuts into
  its keyframes (PyAV), the others three keyframes, each with a webhook and an Idempotency-Key (a refused
  submission is sent again with it, as a retrying client does);
- two reviewers (two ``X-Modgate-Operator`` names) claiming and labelling (some skipped, one label in ten
  another action than the model's) through ``/admin/review/*``, with 5 % of confident verdicts sampled for
  audit besides the ``review`` ones, each audit item queued twice for two people (their kappa);
- a thinking-policy flip through ``PUT /admin/thinking-policy`` every ``--flip-every`` seconds.

Meanwhile, on a schedule drawn from ``--seed`` and printed at the start, one fault at a time every 30–60 s
(scaled down with the duration under 600 s): ``kill -9`` of a replica (restarted), an engine restarted, an
engine slow, an engine answering busy, the Redis primary killed (Sentinel fails over; it comes back as a
replica), the webhook receiver down, the Redis primary stalled (SIGSTOP, under the sentinels' down-after),
and once a model swap (the vLLM engine restarted serving another model id).

Then the load stops, accepted jobs are awaited, and the invariants are checked (``bench.soak_checks``) and
printed as a table, with live-call latency percentiles in and out of the fault windows. Exits 1 when an
invariant fails.

    python -m bench.soak [--duration 600] [--seed 7] [--json soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from PIL import Image

from bench.soak_checks import (
    Answer,
    Observations,
    Window,
    check,
    latencies,
    result_decisions,
    rows_from_stream,
    table_text,
)
from bench.soak_parts import ADMIN_TOKEN, API_KEYS, MODELS, Fleet, ok_engine_calls
from deploy.keyframes import make_keyframe
from deploy.videos import Scene, make_video
from gateway.jobs.store_redis import RedisJobStore
from gateway.review.store_redis import TENANTS as REVIEW_TENANTS
from gateway.review.store_redis import RedisReviewStore

LABELS = ("allow", "allow", "allow", "review", "block:violence", "block:sexual")
FAULTS = ("replica_kill", "engine_restart", "engine_slow", "engine_busy", "redis_primary_kill",
          "webhook_down", "redis_stall")
DECISIONS_STREAM = "modgate:decisions"


@dataclass
class Fault:
    """One entry of the schedule: when (seconds into the soak), what, on which part, and for how long."""

    at: float
    kind: str
    target: int  # which replica or engine
    hold_s: float  # how long a fault that lasts (slow, busy, receiver down, stall) lasts


def schedule(duration_s: float, seed: int) -> list[Fault]:
    """One fault at a time, every 30–60 s (scaled down under 600 s), each kind in turn in a seeded order
    (shuffled again every round), and a model swap once in the first round."""
    scale = min(1.0, duration_s / 600)
    rng = random.Random(seed)
    at, tail = max(8.0, 20 * scale), max(8.0, 20 * scale)
    faults: list[Fault] = []
    kinds: list[str] = []
    swapped = False
    while at < duration_s - tail:
        if not kinds:
            kinds = rng.sample(FAULTS, len(FAULTS))
            if not swapped:
                kinds.insert(len(kinds) // 2, "model_swap")
                swapped = True
        kind = kinds.pop(0)
        hold = max(3.0, rng.uniform(10, 20) * scale)
        if kind == "redis_stall":  # under the sentinels' down-after (4 s): a stall, not a failover
            hold = min(2.0, max(1.5, hold / 4))
        faults.append(Fault(round(at, 1), kind, rng.randrange(2), round(hold, 1)))
        at += rng.uniform(30, 60) * scale
    return faults


def data_url(image: bytes, mime: str = "image/jpeg") -> str:
    """A base64 ``data:`` URL."""
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def part(image: bytes, mime: str = "image/jpeg") -> dict[str, Any]:
    """One ``image_url`` input part."""
    return {"type": "image_url", "image_url": {"url": data_url(image, mime)}}


def _wait(sent_at: float, details: dict[str, Any]) -> tuple[float, float]:
    """When a verdict's call began waiting for an engine slot and when it got one, in seconds into the soak:
    after its shaping, for its ``queue_ms`` (the time before the gateway began the request, a few ms, is not
    in the answer: both tenants' calls are late by it alike)."""
    began = sent_at + details["shaping_ms"] / 1000
    return began, began + details["queue_ms"] / 1000


def bad_images() -> list[tuple[str, bytes]]:
    """Inputs that must be refused with a 4xx: a truncated JPEG, a GIF."""
    frame = make_keyframe("allow", 320, 180, seed=999)
    gif = io.BytesIO()
    Image.new("RGB", (32, 32)).save(gif, "GIF")
    return [("image/jpeg", frame[: len(frame) // 2]), ("image/gif", gif.getvalue())]


def local_caps(replica_url: str) -> bool:
    """Whether the replica serves on its local caps alone now (an unanswered replica: no)."""
    try:
        text = httpx.get(f"{replica_url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return False
    return any(line.startswith("modgate_engine_leases_local_only") and float(line.split()[-1]) > 0
               for line in text.splitlines())


class Soak:
    """The load, the faults and what they saw."""

    def __init__(self, args: argparse.Namespace, fleet: Fleet) -> None:
        self.args = args
        self.fleet = fleet
        # After a Redis fault, calls admitted on local caps (2 s of them) may run up to the total timeout.
        self.seen = Observations(deadline_s=args.queue_timeout_s + 2 * args.total_timeout_s,
                                 caps={e.name: e.cap for e in fleet.engines},
                                 redis_settle_s=2 + args.total_timeout_s)
        self.started = time.monotonic()
        self.stop_at = self.started + args.duration
        self.frames = [make_keyframe(LABELS[i % len(LABELS)], 640, 360, seed=i) for i in range(48)]
        # 3-second videos of three scenes (the middle one of any label), cut by the gateways with PyAV
        self.videos = [
            make_video([Scene("allow", 1, seed=i), Scene(LABELS[(i + 3) % len(LABELS)], 1, seed=i + 1),
                        Scene("allow", 1, seed=i + 2)])
            for i in range(4)
        ]
        self.rng = random.Random(args.seed)
        self.fired: list[str] = []
        self.ok_banked: Counter[tuple[str, str]] = Counter()  # engine calls counted ok by killed replicas

    def now(self) -> float:
        """Seconds into the soak."""
        return time.monotonic() - self.started

    async def call(self, http: httpx.AsyncClient, what: str, tenant: str, method: str, path: str,
                   **kwargs: Any) -> httpx.Response | None:
        """One exchange, recorded as an :class:`Answer`; None when no answer came."""
        at = self.now()
        try:
            response = await http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            self.seen.answers.append(Answer(at, what, tenant, 0, self.now() - at, type(exc).__name__))
            return None
        answer = Answer(at, what, tenant, response.status_code, self.now() - at,
                        retry_after="retry-after" in response.headers)
        if response.status_code >= 400:
            try:
                answer.code = str(response.json()["error"]["code"])
            except (ValueError, KeyError, TypeError):
                answer.openai_shape = False
                answer.code = "not-openai-shape"
        elif what == "live" and response.status_code == 200:
            body = response.json()
            answer.request_id = body["id"]
            answer.actions = tuple(r["modgate"]["action"] for r in body["results"])
            answer.engine_requests = tuple(r["modgate"]["request_id"] for r in body["results"])
            answer.reused = tuple(bool(r["modgate"].get("reused")) for r in body["results"])
            answer.waits = tuple(_wait(at, r["modgate"]) for r in body["results"]
                                 if not r["modgate"].get("reused") and not r["modgate"].get("escalated_from"))
        self.seen.answers.append(answer)
        return response

    async def live_caller(self, http: httpx.AsyncClient, tenant: str, rng: random.Random) -> None:
        """Keyframes, one call at a time, at most ``--rate`` a second; some bad input."""
        bad = bad_images()
        headers = {"Authorization": f"Bearer {API_KEYS[tenant]}"}
        while time.monotonic() < self.stop_at:
            began = time.monotonic()
            if rng.random() < 0.04:
                mime, image = rng.choice(bad)
                await self.call(http, "bad-input", tenant, "POST", "/v1/moderations",
                                json={"input": [part(image, mime)]}, headers=headers)
            else:
                await self.call(http, "live", tenant, "POST", "/v1/moderations",
                                json={"input": [part(rng.choice(self.frames))]}, headers=headers)
            await asyncio.sleep(max(0.0, 1 / self.args.rate - (time.monotonic() - began)))

    async def job_submitter(self, http: httpx.AsyncClient) -> None:
        """A job every ``--job-every`` s, tenants in turn, every third a video (cut into its keyframes by the
        gateway), the others 3 keyframes; a refused one sent again with its key."""
        number = 0
        while time.monotonic() < self.stop_at:
            tenant = sorted(API_KEYS)[number % 2]
            body: dict[str, Any] = {"video_id": f"soak-{number}", "webhook_url": self.fleet.receiver.url}
            if number % 3 == 2:
                video = data_url(self.rng.choice(self.videos), "video/mp4")
                body |= {"video": {"url": video}, "sampling": {"max_fps": 1.0}}
            else:
                body["frames"] = [part(self.rng.choice(self.frames)) for _ in range(3)]
            headers = {"Authorization": f"Bearer {API_KEYS[tenant]}",
                       "Idempotency-Key": f"soak-job-{number}"}
            for _ in range(10):
                response = await self.call(http, "job", tenant, "POST", "/v1/jobs", json=body,
                                           headers=headers)
                if response is not None and response.status_code == 202:
                    self.seen.jobs[response.json()["id"]] = tenant
                    if "video" in body:
                        self.seen.video_jobs.add(response.json()["id"])
                    break
                await asyncio.sleep(1.0)
            number += 1
            await asyncio.sleep(self.args.job_every)

    async def reviewer(self, http: httpx.AsyncClient, name: str, rng: random.Random) -> None:
        """Claim, then label (or, one time in six, skip) until the load stops."""
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": name}
        while time.monotonic() < self.stop_at:
            response = await self.call(http, "review", "", "POST", "/admin/review/claim", headers=headers)
            if response is None or response.status_code != 200:
                await asyncio.sleep(1.0)
                continue
            item = response.json()
            self.seen.claimed[item["id"]] = item.get("request_id", "")
            self.seen.queued_request_ids.add(item.get("request_id", ""))
            await asyncio.sleep(rng.uniform(0.2, 1.0))  # a look at the frame
            if rng.random() < 1 / 6:
                skipped = await self.call(http, "review", "", "POST", f"/admin/review/{item['id']}/skip",
                                          headers=headers)
                if skipped is not None and skipped.status_code == 204:
                    self.seen.skipped.add(item["id"])
                continue
            action = item["action"]
            if rng.random() < 0.1:  # people disagree now and then: kappa has something to measure
                action = rng.choice([a for a in ("allow", "review", "block") if a != action])
            label = {"action": action, "categories": (item.get("categories") or ["violence"])
                     if action == "block" else []}
            labelled = await self.call(http, "review", "", "POST", f"/admin/review/{item['id']}/label",
                                       json=label, headers=headers)
            if labelled is not None and labelled.status_code == 200:
                self.seen.labelled.add(item["id"])

    async def flipper(self, http: httpx.AsyncClient) -> None:
        """The thinking policy's default mode flipped every ``--flip-every`` s."""
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        number = 0
        while time.monotonic() < self.stop_at:
            await asyncio.sleep(self.args.flip_every)
            number += 1
            current = await self.call(http, "flip-read", "", "GET", "/admin/thinking-policy", headers=headers)
            if current is None or current.status_code != 200:
                continue
            document = {k: v for k, v in current.json().items()
                        if k not in ("version", "content_hash", "store")}
            document["default_mode"] = "off" if document["default_mode"] == "on" else "on"
            await self.call(http, "flip", "", "PUT", "/admin/thinking-policy",
                            json={**document, "reason": f"soak flip {number}"}, headers=headers)

    async def sampler(self) -> None:
        """Every 0.5 s, each engine's in-flight peak since the last read, and whether a replica holds the
        engines' caps on its own (``modgate_engine_leases_local_only``: Redis did not answer a lease in
        time, faulted or only slow on a busy machine)."""
        while time.monotonic() < self.stop_at:
            for engine in self.fleet.engines:
                peak = await asyncio.to_thread(engine.peaks)
                if peak is not None:
                    self.seen.engine_peaks.append((self.now(), engine.name, peak))
            for replica in self.fleet.replicas:
                if await asyncio.to_thread(local_caps, replica.url):
                    spell = Window("local_caps", self.now() - 0.5, self.now(), replica.name)
                    self.seen.local_caps.append(spell)
            await asyncio.sleep(0.5)

    async def injector(self, faults: list[Fault]) -> None:
        """Each fault at its time (or as soon as the one before is over), one at a time."""
        for fault in faults:
            await asyncio.sleep(max(0.0, fault.at - self.now()))
            if time.monotonic() >= self.stop_at:
                break
            start = self.now()
            target = await asyncio.to_thread(self.inject, fault)
            self.seen.windows.append(Window(fault.kind, start, self.now(), target))
            self.fired.append(fault.kind)
            print(f"  {start:7.1f} s  {fault.kind:<18} {target:<16} over at {self.now():.1f} s", flush=True)

    def inject(self, fault: Fault) -> str:
        """Do one fault (blocking); answers what it struck."""
        fleet, kind = self.fleet, fault.kind
        if kind == "replica_kill":
            self.ok_banked += ok_engine_calls(fleet.replicas[fault.target].url)  # its counts die with it
            fleet.kill_replica(fault.target)
            return fleet.replicas[fault.target].name
        if kind in ("engine_restart", "model_swap"):
            index = 0 if kind == "model_swap" else fault.target
            fleet.restart_engine(index, MODELS[1] if kind == "model_swap" else None)
            if kind == "model_swap":
                self.seen.model_swaps_seen = self.replicas_serve(MODELS[1])
            return fleet.engines[index].name
        if kind in ("engine_slow", "engine_busy"):
            engine = fleet.engines[fault.target]
            slow = {"slow_rate": 0.5, "slow_s": self.args.first_token_timeout_s * 1.5}
            engine.faults(**(slow if kind == "engine_slow" else {"busy_rate": 0.7}))
            time.sleep(fault.hold_s)
            with contextlib.suppress(httpx.HTTPError):  # restarted meanwhile: its faults are off already
                engine.faults()
            return engine.name
        if kind == "redis_primary_kill":
            fleet.kill_redis_primary()
            return "redis primary"
        if kind == "redis_stall":
            fleet.stall_redis(fault.hold_s)
            return "redis primary"
        if kind == "webhook_down":
            fleet.receiver.stop()
            time.sleep(fault.hold_s)
            fleet.receiver.start()
            return "webhook receiver"
        raise ValueError(f"unknown fault {kind}")

    def replicas_serve(self, model: str, timeout_s: float = 60) -> list[bool]:
        """Whether each replica's ``/readyz`` names ``model`` among its engines' within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        seen = [False] * len(self.fleet.replicas)
        while not all(seen) and time.monotonic() < deadline:
            for index, replica in enumerate(self.fleet.replicas):
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    engines = httpx.get(f"{replica.url}/readyz", timeout=5).json()["engines"]
                    ids = [(engine.get("model") or {}).get("id") for engine in engines]
                    seen[index] = seen[index] or model in ids
            time.sleep(0.5)
        return seen

    async def run(self, faults: list[Fault]) -> None:
        """The load and the faults, side by side, until ``--duration`` is over."""
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
        timeout = httpx.Timeout(self.seen.deadline_s * 3, connect=5)
        async with httpx.AsyncClient(base_url=self.fleet.url, timeout=timeout, limits=limits) as http:
            rng = random.Random(self.args.seed + 1)
            counts = {"tenant-a": self.args.clients_a, "tenant-b": self.args.clients_b}
            callers = [self.live_caller(http, tenant, random.Random(rng.random()))
                       for tenant, count in counts.items() for _ in range(count)]
            await asyncio.gather(
                *callers, self.job_submitter(http), self.flipper(http), self.sampler(), self.injector(faults),
                *(self.reviewer(http, name, random.Random(i)) for i, name in enumerate(("rita", "sam"))),
            )

    def settle(self) -> None:
        """After the load: every accepted job finished, its webhook delivered, the policy converged; then
        read the decision log and the review queue from the Redis primary."""
        seen = self.seen

        def client() -> Any:  # redis-py's replies are typed loosely: this reads them as the soak wrote them
            return redis.Redis.from_url(self.fleet.redis_primary_url(), decode_responses=True)

        deadline = time.monotonic() + self.args.drain_s
        while True:
            with contextlib.suppress(redis.RedisError):
                state = client()
                records = {job: state.hgetall(RedisJobStore.job_key(job)) for job in seen.jobs}
                state.close()
                seen.job_states = {job: (r.get("status", "missing"), int(r.get("completions", 0)))
                                   for job, r in records.items()}
                seen.job_decisions = {job: result_decisions(r["result"])
                                      for job, r in records.items() if r.get("result")}
            done = all(s in ("succeeded", "failed") for s, _ in seen.job_states.values())
            delivered = all(self.fleet.receiver.deliveries.get(job, 0) for job in seen.jobs)
            if (done and delivered) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        seen.deliveries = self.fleet.receiver.deliveries.copy()
        seen.bad_signatures = self.fleet.receiver.bad_signatures
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        deadline = time.monotonic() + 30
        while True:
            versions: list[int | None] = []
            for replica in self.fleet.replicas:
                try:
                    versions.append(int(httpx.get(f"{replica.url}/admin/thinking-policy", headers=headers,
                                                  timeout=5).json()["version"]))
                except (httpx.HTTPError, ValueError, KeyError):
                    versions.append(None)
            if (None not in versions and len(set(versions)) == 1) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        seen.policy_versions = versions
        calls = self.ok_banked + sum((ok_engine_calls(r.url) for r in self.fleet.replicas), Counter())
        for engine in self.fleet.engines:
            seen.engine_ok[engine.name] = Counter({purpose: n for (url, purpose), n in calls.items()
                                                   if url == engine.url})
            seen.engine_whole[engine.name] = engine.answers_whole()
        time.sleep(5)  # the decision log's background retries of a row a fault held up
        state = client()
        try:
            seen.decision_rows = rows_from_stream(state.xrange(DECISIONS_STREAM))
            for tenant in state.smembers(REVIEW_TENANTS):
                for _, fields in state.xrange(RedisReviewStore.stream_key(tenant)):
                    seen.still_queued.add(fields["item"])
                    request, decision = state.hmget(RedisReviewStore.item_key(fields["item"]),
                                                    ["request_id", "decision_id"])
                    if request:  # each field of the item's hash is JSON
                        seen.queued_request_ids.add(json.loads(request))
                    if decision and json.loads(decision):
                        seen.still_queued_decisions.add(json.loads(decision))
        finally:
            state.close()


async def _drive(soak: Soak, faults: list[Fault]) -> None:
    await soak.run(faults)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet, soak it, check the invariants; answers the report."""
    faults = schedule(args.duration, args.seed)
    print(f"soak: {args.duration:g} s, seed {args.seed}; the fault schedule (seconds in, what, target, "
          "hold):")
    for fault in faults:
        print(f"  {fault.at:7.1f} s  {fault.kind:<18} #{fault.target}  {fault.hold_s:g} s", flush=True)
    directory = Path(args.work_dir or tempfile.mkdtemp(prefix="modgate-soak-"))
    settings = {
        "MODGATE_SERVER__LOG_LEVEL": "warning",
        "MODGATE_ENGINE__FIRST_TOKEN_TIMEOUT_S": str(args.first_token_timeout_s),
        "MODGATE_ENGINE__TOTAL_TIMEOUT_S": str(args.total_timeout_s),
        "MODGATE_ADMISSION__QUEUE_TIMEOUT_S": str(args.queue_timeout_s),
        "MODGATE_ADMISSION__QUEUE_SIZE": "64",
        "MODGATE_JOBS__WAIT_REPLICAS": "1",
        "MODGATE_JOBS__CLAIM_IDLE_S": "5",
        "MODGATE_JOBS__RETRY_WAIT_S": "0.5",
        "MODGATE_JOBS__MAX_ATTEMPTS": "10",
        "MODGATE_JOBS__WEBHOOK_ATTEMPTS": "10",  # 0.5 s doubling to 30 s: a receiver down ~2 min
        "MODGATE_REVIEW__AUDIT_SAMPLE_RATE": "0.05",
        "MODGATE_REVIEW__DOUBLE_LABEL_SHARE": "1.0",  # every audit item twice: a pair for two reviewers
        "MODGATE_REVIEW__WAIT_REPLICAS": "1",  # a review verdict is answered once a replica holds its item
        "MODGATE_REVIEW__WAIT_TIMEOUT_MS": "1000",
        "MODGATE_DECISIONS__WAIT_REPLICAS": "1",  # a decision row not on a replica is tried again
        "MODGATE_LEASES__RETRY_AFTER_FAILURE_S": "2",  # local caps only this long after Redis failed
        "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0",  # every frame to an engine: the faults meet the work
    }
    if args.unfair:
        settings |= {"MODGATE_ADMISSION__FAIRNESS": "fifo", "MODGATE_LEASES__FAIR_SHARE": "false"}
    fleet = Fleet(directory, args.time_scale, settings)
    try:
        fleet.start()
        soak = Soak(args, fleet)
        print("faults as they ran:", flush=True)
        asyncio.run(_drive(soak, faults))
        load_s = soak.now()
        soak.settle()
    finally:
        fleet.stop()
    seen = soak.seen
    table = check(seen)
    live = [a for a in seen.answers if a.what == "live"]
    videos_done = sum(seen.job_states.get(job, ("", 0))[0] == "succeeded" for job in seen.video_jobs)
    return {
        "duration_s": round(load_s, 1),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "work_dir")},
        "schedule": [asdict(f) for f in faults],
        "faults_fired": [asdict(w) for w in seen.windows],
        "fault_kinds_not_fired": sorted({f.kind for f in faults} - set(soak.fired)),
        "jobs": {"accepted": len(seen.jobs), "videos": len(seen.video_jobs),
                 "videos_succeeded": videos_done},
        "invariants": table,
        "holds": all(r["holds"] for r in table),
        "live_latency_s": latencies(seen),
        "live": {"calls": len(live), "verdicts": sum(len(a.actions) for a in live),
                 "per_s": round(len(live) / max(load_s, 1), 2)},
        "logs": str(directory),
    }


def options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--seed", type=int, default=7, help="draws the fault schedule and the load")
    parser.add_argument("--clients-a", type=int, default=10, help="live callers of tenant-a")
    parser.add_argument("--clients-b", type=int, default=5,
                        help="live callers of tenant-b (fewer: a first-come queue would give it a third "
                             "of the engine, the fair share half)")
    parser.add_argument("--rate", type=float, default=2.0, help="most calls a second of one caller")
    parser.add_argument("--job-every", type=float, default=3.0, help="seconds between job submissions")
    parser.add_argument("--flip-every", type=float, default=5.0, help="seconds between policy flips")
    parser.add_argument("--time-scale", type=float, default=0.2, help="simulator pace (1 = the Spark's)")
    parser.add_argument("--first-token-timeout-s", type=float, default=3.0)
    parser.add_argument("--total-timeout-s", type=float, default=10.0)
    parser.add_argument("--queue-timeout-s", type=float, default=5.0)
    parser.add_argument("--drain-s", type=float, default=120.0, help="time for accepted jobs to finish")
    parser.add_argument("--work-dir", type=Path, help="where the parts keep their logs (default: a new temp)")
    parser.add_argument("--unfair", action="store_true",
                        help="plant a defect: first come, first served (no fair share in a replica or across "
                             "them); the fair-share row must then say no")
    parser.add_argument("--json", type=Path, help="also write the report here")
    return parser.parse_args(argv)


def print_report(report: dict[str, Any]) -> None:
    """The table and the latencies."""
    print(f"\nsoak: {report['duration_s']} s of load, {report['live']['calls']} live calls "
          f"({report['live']['per_s']}/s); faults not fired: {report['fault_kinds_not_fired'] or 'none'}")
    print(table_text(report["invariants"]))
    for where, figures in report["live_latency_s"].items():
        print(f"live latency {where.replace('_', ' ')}: {figures}")
    print(f"logs: {report['logs']}")


def main() -> None:
    """Command line."""
    args = options()
    report = run(args)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if not report["holds"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
