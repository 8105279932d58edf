"""Added latency of modgate and of LiteLLM's proxy over an engine that takes no time, side by side.

Three arms in front of the same engine stub on loopback, each in a process of its own:

- ``engine``: the chat request straight to the engine (the floor every gateway adds to);
- ``modgate``: the moderation request for the same keyframe (shaping, thinking policy, admission, the
  engine call streamed, verdict parsing, telemetry), thinking off;
- ``litellm``: the same chat request through LiteLLM's proxy (``bench/litellm_env.py``), configured with
  the engine as an OpenAI-compatible backend.

Like with like: the direct arms post exactly the engine request modgate sends (its compact verdict, its
grammar, ``top_logprobs`` …): before timing, each keyframe goes through modgate once and the stub hands
back the body it received (``/stub/last``). The stub counts the distinct requests it saw (the same JSON
however serialised): one per keyframe means every arm asked the engine the same thing.

Two paths, measured in the same run:

- ``cheapest``: a frame already on the token grid (passed through, no resize), no verdict cache, state in
  memory, no telemetry export;
- ``production``: photo-like 1280×720 keyframes that must be shaped, state in Redis, the verdict cache on
  (every lookup a miss: each request a keyframe its tenant has not sent before; every verdict stored),
  traces and metrics exported over OTLP/HTTP to a local receiver (``bench/otlp_sink.py``). The run also
  measures the shaping floor: the median of ``shape_image`` on those keyframes, one thread.

Closed loops of 1, 8 and 64 clients; the requests of each concurrency are split into rounds and the arms
take turns within each round (the order rotating), so a burst of load from elsewhere on the machine lands
on all of them alike. Added latency = arm minus its path's engine arm, at the median and at p99.

The engine is ``bench/engine_stub.py`` by default: the instant simulator's own answers, replayed per
distinct body, because the simulator itself spends ~10 ms of CPU a request (JPEG decode, tokenizing),
which is as much as the overhead measured and competes for the same cores.

    python -m bench.overhead [--requests 600] [--concurrency 1 8 64] [--paths cheapest production]
                             [--redis-url redis://127.0.0.1:6379/14] [--json docs/bench/overhead.json]
    python -m bench.overhead --paths cheapest --workers 2 4 --redis-url redis://127.0.0.1:6379/14
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvloop

from bench.keepalive import KeepAliveConnection
from bench.litellm_env import LITELLM_VERSION, SERVED_NAME, litellm_proxy
from bench.overhead_paths import (
    PATHS,
    PRODUCTION_FRAME,
    Arm,
    Callers,
    PathFrames,
    authorization,
    capture,
    gateway_environment,
    litellm_body,
    reused_verdicts,
    shaping_floor,
)
from bench.servers import cpu_seconds, free_port, gateway, gateway_process, process
from deploy.simulator import PRESETS

ARMS = ("engine", "modgate", "litellm")
MODEL = PRESETS["instant"].model
# Both gateways check a bearer key, as in production (LiteLLM will not start without its master key).
MODGATE_KEY = "bench-" + secrets.token_hex(16)
LITELLM_KEY = "sk-bench-" + secrets.token_hex(16)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


@dataclass
class ArmRun:
    """What one arm measured at one concurrency, over all rounds."""

    latencies: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    errors: int = 0
    cpu_s: float | None = None  # the gateway process's CPU time over the timed requests (modgate arms)

    def figures(self) -> dict[str, float]:
        """Median, p99 (ms) and requests per second; the gateway's CPU ms per request where measured."""
        figures = {
            "p50_ms": statistics.median(self.latencies) * 1e3,
            "p99_ms": percentile(self.latencies, 99) * 1e3,
            "rps": len(self.latencies) / self.elapsed_s,
            "errors": float(self.errors),
        }
        if self.cpu_s is not None:
            figures["cpu_ms_per_request"] = self.cpu_s * 1e3 / len(self.latencies)
        return figures


async def closed_loop(arm: Arm, requests: int, concurrency: int, run: ArmRun) -> None:
    """``requests`` calls by ``concurrency`` clients back to back (a connection each), added to ``run``."""
    remaining = requests

    async def client(connection: KeepAliveConnection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            try:
                reply = await connection.request(arm.next_request())
            except OSError as exc:  # refused, reset: which arm, at which load, is what a reader needs
                raise RuntimeError(f"the {arm.name or arm.url} arm failed at {concurrency} client(s), with "
                                   f"{len(run.latencies) + run.errors} answered: {exc!r}") from exc
            if reply.status == 200:
                run.latencies.append(time.perf_counter() - started)
            else:
                run.errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(connection) for connection in arm.connections(concurrency)))
    run.elapsed_s += time.perf_counter() - started


@contextlib.contextmanager
def engine_stub() -> Iterator[str]:
    """``bench/engine_stub.py`` in a process of its own; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with process([sys.executable, "-m", "bench.engine_stub", "--port", str(port)], f"{url}/health"):
        yield url


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    """``bench/otlp_sink.py`` in a process of its own; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with process([sys.executable, "-m", "bench.otlp_sink", "--port", str(port)], f"{url}/sink/info"):
        yield url


def arm_name(arm: str, path: str) -> str:
    """``engine``, ``modgate``, ``litellm`` on the cheapest path; ``engine@production`` … on the other."""
    return arm if path == "cheapest" else f"{arm}@{path}"


def path_of(name: str) -> str:
    """The path an arm's name says."""
    return name.partition("@")[2] or "cheapest"


@dataclass
class Setup:
    """What the arms post: per path, the frames, modgate's callers and the engine bodies it sent."""

    frames: dict[str, PathFrames]
    callers: dict[str, Callers]
    engine_bodies: dict[str, list[bytes]] = field(default_factory=dict)
    shaping_times: dict[str, list[float]] = field(default_factory=dict)  # measured between rounds

    def time_shaping(self) -> None:
        """Shape every path's keyframes once more (between rounds: the same load as the arms had)."""
        for path, frames in self.frames.items():
            self.shaping_times.setdefault(path, []).extend(frames.shaping_times())


def arms_for(urls: dict[str, str], setup: Setup) -> dict[str, Arm]:
    """The arms to time, with their request bytes encoded once."""
    arms: dict[str, Arm] = {}
    for name, base in urls.items():
        path = path_of(name)
        engine_bodies = setup.engine_bodies[path]
        if name.startswith("engine"):
            arms[name] = Arm(f"{base}/v1/chat/completions", engine_bodies, [b""])
        elif name.startswith("modgate"):
            callers = [authorization(key, "X-Modgate-Thinking: off") for key in setup.callers[path].tenants]
            arms[name] = Arm(f"{base}/v1/moderations", setup.frames[path].moderation_bodies(), callers)
        else:
            bodies = [litellm_body(body, SERVED_NAME) for body in engine_bodies]
            arms[name] = Arm(f"{base}/v1/chat/completions", bodies, [authorization(LITELLM_KEY)])
        arms[name].name = name
    return arms


async def check_litellm(http: httpx.AsyncClient, url: str, body: bytes) -> None:
    """LiteLLM relays a real answer before it is timed (a fast error is not a fast gateway)."""
    response = await http.post(f"{url}/v1/chat/completions", content=body,
                               headers={"Authorization": f"Bearer {LITELLM_KEY}",
                                        "Content-Type": "application/json"})
    if response.status_code != 200 or "[DONE]" not in response.text or '"stop"' not in response.text:
        raise RuntimeError(f"litellm did not answer the keyframe: {response.status_code} "
                           f"{response.text[:300]}")


async def measure(urls: dict[str, str], setup: Setup, engine_url: str, requests: int,
                  concurrencies: list[int], rounds: int,
                  pids: dict[str, int] | None = None) -> dict[int, dict[str, ArmRun]]:
    """Every arm at every concurrency, in interleaved rounds; ``pids``: the one-process gateways' process
    ids by arm, whose CPU time over their timed requests is measured too."""
    pids = pids or {}
    async with httpx.AsyncClient(timeout=120) as http:
        await http.post(f"{engine_url}/stub/mark")  # what the gateways asked at start is not the arms'
        for name, url in urls.items():  # modgate's own engine requests, one per keyframe of its path
            if name.startswith("modgate") and path_of(name) not in setup.engine_bodies:
                path = path_of(name)
                key = setup.callers[path].capture
                setup.engine_bodies[path] = await capture(http, url, engine_url, key, setup.frames[path])
        for name, url in urls.items():
            if name.startswith("litellm"):
                body = litellm_body(setup.engine_bodies[path_of(name)][0], SERVED_NAME)
                await check_litellm(http, url, body)
    arms = arms_for(urls, setup)
    names = list(arms)
    results: dict[int, dict[str, ArmRun]] = {}
    for concurrency in concurrencies:
        runs = {name: ArmRun() for name in names}
        for name in names:  # warm every connection and code path at this concurrency (and every body)
            await closed_loop(arms[name], max(2 * concurrency, len(arms[name].bodies)), concurrency, ArmRun())
        per_round = max(concurrency, requests // rounds)
        for round_no in range(rounds):
            for name in names[round_no % len(names):] + names[: round_no % len(names)]:
                pid = pids.get(name)
                cpu_before = cpu_seconds(pid) if pid else 0.0
                await closed_loop(arms[name], per_round, concurrency, runs[name])
                if pid:
                    runs[name].cpu_s = (runs[name].cpu_s or 0.0) + cpu_seconds(pid) - cpu_before
            setup.time_shaping()
        results[concurrency] = runs
    for name, arm in arms.items():
        if name.startswith("modgate") and arm.sent > arm.distinct and path_of(name) == "production":
            raise RuntimeError(f"{name} sent {arm.sent} requests, more than its {arm.distinct} distinct "
                               "(tenant, keyframe) pairs: some verdicts would be reused; raise --tenants")
    await asyncio.gather(*(connection.close() for arm in arms.values() for connection in arm.pool))
    return results


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else float("nan")


def summarize(results: dict[int, dict[str, ArmRun]]) -> dict[str, Any]:
    """Figures per concurrency and arm, with added latency over the path's engine arm and modgate-to-LiteLLM
    ratios (on the same path)."""
    table: dict[str, Any] = {}
    for concurrency, runs in results.items():
        figures = {arm: run.figures() for arm, run in runs.items()}
        for arm, row in figures.items():
            base = figures.get(arm_name("engine", path_of(arm)))
            if base is not None and not arm.startswith("engine"):
                row["added_p50_ms"] = row["p50_ms"] - base["p50_ms"]
                row["added_p99_ms"] = row["p99_ms"] - base["p99_ms"]
        over: dict[str, dict[str, float]] = {}
        for arm, mod in figures.items():
            lite = figures.get(arm_name("litellm", path_of(arm)))
            if arm.startswith("modgate") and lite is not None and "added_p50_ms" in mod:
                over[arm] = {
                    "added_p50": _ratio(mod["added_p50_ms"], lite["added_p50_ms"]),
                    "added_p99": _ratio(mod["added_p99_ms"], lite["added_p99_ms"]),
                    "rps": _ratio(mod["rps"], lite["rps"]),
                }
        table[str(concurrency)] = {
            "arms": figures,
            "modgate_over_litellm": over.get("modgate", {}),
            "over_litellm": over,
        }
    return table


def verdict_on_targets(report: dict[str, Any]) -> list[str]:
    """The issue's targets against this run's figures, each said plainly (met or missed, to 3 places)."""
    results, floor = report["results"], report["setup"].get("shaping_floor", {}).get("production")
    lines = []
    one, eight = results.get("1", {}).get("over_litellm", {}), results.get("8", {}).get("over_litellm", {})
    if "modgate" in one:
        ratio = one["modgate"]["added_p50"]
        lines.append(f"cheapest path, added p50 at 1 client: {ratio:.3f}x LiteLLM's (target <= 0.2x): "
                     f"{'met' if ratio <= 0.2 else 'MISSED'}")
    if "modgate" in eight:
        ratio = eight["modgate"]["rps"]
        lines.append(f"cheapest path, req/s at 8 clients: {ratio:.3f}x LiteLLM's (target >= 6x): "
                     f"{'met' if ratio >= 6 else 'MISSED'}")
    arms = results.get("1", {}).get("arms", {})
    if floor and "modgate@production" in arms and "litellm@production" in arms:
        beyond = arms["modgate@production"]["added_p50_ms"] - floor["median_ms"]
        ratio = _ratio(beyond, arms["litellm@production"]["added_p50_ms"])
        lines.append(f"production path, added p50 at 1 client beyond the shaping floor "
                     f"({floor['median_ms']:.2f} ms): {beyond:.2f} ms = {ratio:.3f}x LiteLLM's added p50 "
                     "(target <= 0.15x): "
                     f"{'met' if ratio <= 0.15 else 'MISSED'}")
    return lines


def print_markdown(table: dict[str, Any]) -> None:
    """The table in Markdown (docs/benchmarks.md): a row per path and concurrency, the arms side by side."""
    print("\n| path | clients | engine p50 / p99 ms | modgate added p50 / p99 ms | "
          "LiteLLM added p50 / p99 ms | "
          "modgate ÷ LiteLLM, added p50 / p99 | req/s engine / modgate / LiteLLM |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for path in PATHS:
        for concurrency, entry in table.items():
            arms, ratios = entry["arms"], entry["over_litellm"].get(arm_name("modgate", path))
            if not ratios:
                continue
            engine, mod = arms[arm_name("engine", path)], arms[arm_name("modgate", path)]
            lite = arms[arm_name("litellm", path)]
            print(f"| {path} | {concurrency} | {engine['p50_ms']:.2f} / {engine['p99_ms']:.2f} | "
                  f"{mod['added_p50_ms']:.1f} / {mod['added_p99_ms']:.1f} | "
                  f"{lite['added_p50_ms']:,.1f} / {lite['added_p99_ms']:,.1f} | "
                  f"{ratios['added_p50']:.3f} / {ratios['added_p99']:.3f} | "
                  f"{engine['rps']:,.0f} / {mod['rps']:,.0f} / {lite['rps']:,.0f} |")
    first: dict[str, Any] = next(iter(table.values()), {"arms": {}})
    scaled = [arm for arm in first["arms"] if arm.startswith("modgate:workers")]
    if not scaled:
        return
    names = ["modgate", *scaled]
    print("\n| clients | " + " | ".join(f"{name} req/s (÷ LiteLLM)" for name in names)
          + " | " + " | ".join(f"{name} added p50 ms" for name in names) + " |\n"
          + "| --- " * (1 + 2 * len(names)) + "|")
    for concurrency, entry in table.items():
        arms, over = entry["arms"], entry["over_litellm"]
        rates = [f"{arms[name]['rps']:,.0f} ({over.get(name, {}).get('rps', float('nan')):.2f}×)"
                 for name in names]
        added = [f"{arms[name]['added_p50_ms']:.1f}" for name in names]
        print(f"| {concurrency} | " + " | ".join(rates + added) + " |")


def print_table(table: dict[str, Any]) -> None:
    """One row per concurrency and arm, then the modgate-to-LiteLLM ratios."""
    print(f"{'clients':>7}  {'arm':<20}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}"
          f"{'added p50':>11}{'added p99':>11}{'CPU ms/req':>12}")
    for concurrency, entry in table.items():
        for arm, row in entry["arms"].items():
            added = (f"{row['added_p50_ms']:>11.2f}{row['added_p99_ms']:>11.2f}" if "added_p50_ms" in row
                     else f"{'-':>11}{'-':>11}")
            errors = f"   {row['errors']:.0f} errors" if row["errors"] else ""
            cpu = f"{row['cpu_ms_per_request']:>12.2f}" if "cpu_ms_per_request" in row else f"{'-':>12}"
            print(f"{concurrency:>7}  {arm:<20}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['rps']:>9.1f}"
                  f"{added}{cpu}{errors}")
        for arm, ratios in entry["over_litellm"].items():
            print(f"{'':>7}  {arm}/litellm: added p50 {ratios['added_p50']:.3f}x, added p99 "
                  f"{ratios['added_p99']:.3f}x, req/s {ratios['rps']:.2f}x")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the arms, measure, stop them; answers the figures and how they were taken."""
    extra_env = dict(item.split("=", 1) for item in args.gateway_env)
    timed = sum(max(2 * c, args.frames) + max(c, args.requests // args.rounds) * args.rounds
                for c in args.concurrency)
    frames = {"cheapest": PathFrames.make("cheapest", args.width, args.height, 1)}
    callers = {"cheapest": Callers.make(1)}
    if "production" in args.paths:
        frames["production"] = PathFrames.make("production", *PRODUCTION_FRAME, args.frames)
        callers["production"] = Callers.make(-(-timed // args.frames))  # no (tenant, keyframe) twice
    setup = Setup(frames, callers)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        engine_url = stack.enter_context(engine_stub())
        otlp_url = stack.enter_context(otlp_sink()) if "production" in args.paths else ""
        exported: dict[str, Any] = {}
        if otlp_url:  # read once the gateways have stopped (and flushed what they batched), before the sink
            stack.callback(lambda: exported.update(httpx.get(f"{otlp_url}/sink/info", timeout=30).json()))
        urls: dict[str, str] = {}
        pids: dict[str, int] = {}  # one-process gateways, whose CPU time is measured
        for path in args.paths:
            environment = {**gateway_environment(path, callers[path], args.redis_url, otlp_url), **extra_env}
            urls[arm_name("engine", path)] = engine_url
            name = arm_name("modgate", path)
            urls[name], pids[name] = stack.enter_context(gateway_process(engine_url, **environment))
        cheap = {**gateway_environment("cheapest", callers["cheapest"], "", ""), **extra_env}
        for workers in args.workers:  # modgate with N uvicorn worker processes (state in Redis)
            scaled_env = {**cheap, "MODGATE_WORKERS": str(workers), "MODGATE_REDIS__URL": args.redis_url}
            urls[f"modgate:workers-{workers}"] = stack.enter_context(gateway(engine_url, **scaled_env))
        for label, *settings in args.variant:  # modgate again, with other settings, as arms of their own
            variant_env = {**cheap, **dict(item.split("=", 1) for item in settings)}
            name = f"modgate:{label}"
            urls[name], pids[name] = stack.enter_context(gateway_process(engine_url, **variant_env))
        if "litellm" in args.arms:
            lite = stack.enter_context(litellm_proxy(engine_url, MODEL, LITELLM_KEY, args.litellm_workers))
            for path in args.paths:
                urls[arm_name("litellm", path)] = lite
        for path in set(frames) - {path_of(name) for name in urls}:  # the cheapest, when no arm posts it:
            del frames[path], callers[path]  # not shaped between rounds, counted or described
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # the load generator kept lean
            results = runner.run(
                measure(urls, setup, engine_url, args.requests, args.concurrency, args.rounds, pids)
            )
        stub_info = httpx.get(f"{engine_url}/stub/info").json()
        reused = {name: reused_verdicts(httpx.get(f"{url}/metrics", timeout=30).text)
                  for name, url in urls.items() if name.startswith("modgate@")}
    floor = {path: shaping_floor(times, frames[path].shaped()) for path, times in setup.shaping_times.items()}
    return {
        "setup": {
            "engine": "stub",
            "stub": stub_info,
            "paths": list(args.paths),
            "frames": {path: {"source": f"{f.width}x{f.height}", "keyframes": len(f.sources),
                              "tenants": len(callers[path].tenants)} for path, f in frames.items()},
            "shaping_floor": floor,
            "reused_verdicts": reused,
            "otlp_export": exported,
            "requests_per_arm": args.requests,
            "rounds": args.rounds,
            "litellm": LITELLM_VERSION,
            "litellm_workers": args.litellm_workers,
            "gateway_env": extra_env,
            "workers": [1, *args.workers],
            "cpus": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "results": summarize(results),
    }


def main(argv: list[str] | None = None) -> None:
    """Print the table (and write it as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600, help="timed requests per arm and concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per concurrency")
    parser.add_argument("--arms", nargs="+", choices=ARMS[1:], default=list(ARMS[1:]),
                        help="gateways to measure (the engine arm always runs; modgate must: its engine "
                             "requests are what the other arms post)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--frames", type=int, default=40, help="distinct keyframes on the production path")
    parser.add_argument("--width", type=int, default=1056, help="the cheapest path's frame (on the grid)")
    parser.add_argument("--height", type=int, default=640)
    parser.add_argument("--litellm-workers", type=int, default=1)
    parser.add_argument("--gateway-env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra MODGATE_* settings for the gateways under test")
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar="LABEL KEY=VALUE",
                        help="another modgate arm (cheapest path) with these settings, "
                             "e.g. --variant json-logs MODGATE_TELEMETRY__JSON_LOGS=true")
    parser.add_argument("--workers", type=int, nargs="+", default=[], metavar="N",
                        help="also modgate with N worker processes, one arm per N (needs --redis-url)")
    parser.add_argument("--redis-url", default=os.environ.get("MODGATE_BENCH_REDIS_URL", ""),
                        help="Redis for the production path and the --workers arms (default "
                             "$MODGATE_BENCH_REDIS_URL); it holds their shared state")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = parser.parse_args(argv)
    if "modgate" not in args.arms:
        parser.error("--arms must include modgate: the other arms post the engine requests it sends")
    if any(workers < 2 for workers in args.workers):
        parser.error("--workers takes counts of 2 or more (the plain modgate arm has 1)")
    if args.workers and not args.redis_url:
        parser.error("--workers needs --redis-url (or MODGATE_BENCH_REDIS_URL): modgate refuses to run "
                     "more than one worker without Redis")
    if "production" in args.paths and not args.redis_url:
        parser.error("the production path needs --redis-url (or MODGATE_BENCH_REDIS_URL), e.g. "
                     "redis://127.0.0.1:6379/14; or --paths cheapest")
    report = run(args)
    setup = report["setup"]
    print(f"engine: {setup['engine']}; paths: {', '.join(setup['paths'])}; thinking off; {args.requests} "
          f"timed requests per arm and concurrency, {args.rounds} interleaved rounds; "
          f"LiteLLM {LITELLM_VERSION} "
          f"({args.litellm_workers} worker); {setup['cpus']} CPUs, load average "
          f"{setup['load_before'][0]:.1f} before, {setup['load_after'][0]:.1f} after")
    for path, frames in setup["frames"].items():
        floor = setup["shaping_floor"][path]
        print(f"{path}: {frames['keyframes']} keyframe(s) of {frames['source']} from {frames['tenants']} "
              f"tenant(s), shaped to {floor['shaped']} ({floor['image_tokens']} image tokens, "
              f"{'passed through' if floor['passthrough'] else 'resized'}); shaping floor "
              f"{floor['median_ms']:.2f} ms (median of {floor['samples']}, one thread, between this run's "
              "rounds)")
    if setup["stub"]:
        print(f"engine stub: {setup['stub']['distinct_bodies']} distinct request bodies, "
              f"{setup['stub']['distinct_requests']} distinct requests (the gateways' own at start "
              "included), "
              f"{setup['stub']['replays']} replayed answers")
        keyframes = sum(frames["keyframes"] for frames in setup["frames"].values())
        asked = setup["stub"]["distinct_since_mark"]
        same = asked == keyframes
        verdict = "every arm asked the engine the same" if same else "THE ARMS ASKED DIFFERENT THINGS"
        print(f"like with like: {keyframes} keyframe(s), {asked} distinct engine requests from the first "
              f"capture on: {verdict}")
    for name, count in setup["reused_verdicts"].items():
        print(f"verdict cache: {name} reused {count:.0f} verdicts"
              + (" (every lookup a miss)" if count == 0 else ": NOT EVERY LOOKUP A MISS"))
    if setup["otlp_export"]:
        sent = setup["otlp_export"]["requests"]
        print(f"OTLP export to the local receiver: {sent['/v1/traces']} trace and {sent['/v1/metrics']} "
              "metric posts")
    print_table(report["results"])
    for line in verdict_on_targets(report):
        print(line)
    if args.markdown:
        print_markdown(report["results"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
