"""Added latency of modgate and of LiteLLM's proxy over an engine that takes no time, side by side.

Three arms in front of the same engine stub on loopback, each in a process of its own:

- ``engine``: the keyframe's chat request straight to the engine (the floor every gateway adds to);
- ``modgate``: the moderation request for the same keyframe (shaping, thinking policy, admission, the
  engine call streamed, verdict parsing, telemetry), thinking off;
- ``litellm``: the same chat request through LiteLLM's proxy (``bench/litellm_env.py``), configured with
  the engine as an OpenAI-compatible backend.

Closed loops of 1, 8 and 64 clients; the requests of each concurrency are split into rounds and the arms
take turns within each round (the order rotating), so a burst of load from elsewhere on the machine lands
on all of them alike. Added latency = arm minus engine, at the median and at p99.

The engine is ``bench/engine_stub.py`` by default: the instant simulator's own answers, replayed per
distinct body, because the simulator itself spends ~10 ms of CPU a request (JPEG decode, tokenizing),
which is as much as the overhead measured and competes for the same cores. ``--engine sim`` uses
``modgate engine-sim --preset instant --time-scale 0`` instead.

    python -m bench.overhead [--requests 600] [--concurrency 1 8 64] [--json docs/bench/overhead.json]
    python -m bench.overhead --workers 2 4 --redis-url redis://127.0.0.1:6379/14   # worker scaling
"""

from __future__ import annotations

import argparse
import asyncio
import base64
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

from bench.keepalive import KeepAliveConnection, encode_request
from bench.litellm_env import LITELLM_VERSION, SERVED_NAME, litellm_proxy
from bench.servers import free_port, gateway, process, simulator
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS
from gateway.settings import Settings
from shaping.image import ImageLimits, ShapedImage, shape_image
from shaping.prompt import RequestOptions, build_chat_request, load_system_prompt
from shaping.tokens import TokenGrid

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

    def figures(self) -> dict[str, float]:
        """Median, p99 (ms) and requests per second."""
        return {
            "p50_ms": statistics.median(self.latencies) * 1e3,
            "p99_ms": percentile(self.latencies, 99) * 1e3,
            "rps": len(self.latencies) / self.elapsed_s,
            "errors": float(self.errors),
        }


async def closed_loop(arm: Arm, requests: int, concurrency: int, run: ArmRun) -> None:
    """``requests`` calls by ``concurrency`` clients back to back (a connection each), added to ``run``."""
    remaining = requests

    async def client(connection: KeepAliveConnection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            reply = await connection.request(arm.request)
            if reply.status == 200:
                run.latencies.append(time.perf_counter() - started)
            else:
                run.errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(connection) for connection in arm.connections(concurrency)))
    run.elapsed_s += time.perf_counter() - started


@dataclass
class Arm:
    """One way to get a keyframe judged: where to post, the request bytes, and the clients' connections."""

    url: str
    request: bytes
    pool: list[KeepAliveConnection] = field(default_factory=list)

    def connections(self, concurrency: int) -> list[KeepAliveConnection]:
        """``concurrency`` connections, kept from one round to the next."""
        while len(self.pool) < concurrency:
            self.pool.append(KeepAliveConnection(self.url))
        return self.pool[:concurrency]

    async def close(self) -> None:
        """Close every connection."""
        await asyncio.gather(*(connection.close() for connection in self.pool))
        self.pool.clear()


def shaped_frame(width: int, height: int) -> ShapedImage:
    """The keyframe as modgate shapes it, so the direct arms send exactly the bytes modgate sends."""
    settings = Settings()
    grid = TokenGrid(pixels_per_token=settings.shaping.pixels_per_token,
                     token_budget=settings.shaping.image_token_budget)
    return shape_image(make_keyframe("allow", width, height, seed=5), ImageLimits(), grid,
                       jpeg_quality=settings.shaping.jpeg_quality)


@dataclass(frozen=True)
class Requests:
    """The bodies each arm posts: one keyframe, thinking off."""

    chat: dict[str, Any]
    moderation: dict[str, Any]
    frame: ShapedImage

    @classmethod
    def build(cls, width: int, height: int) -> Requests:
        """The chat request modgate would send for the frame, and the moderation request that makes it."""
        settings = Settings()
        frame = shaped_frame(width, height)
        chat = build_chat_request(
            load_system_prompt(),
            [frame],
            settings.shaping.user_text,
            RequestOptions(model=MODEL, enable_thinking=False,
                           max_completion_tokens=settings.engine.max_completion_tokens_direct),
        )
        source = make_keyframe("allow", width, height, seed=5)
        moderation = {
            "model": "modgate-moderation",
            "input": [{"type": "image_url",
                       "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(source).decode()}}],
        }
        return cls(chat=chat, moderation=moderation, frame=frame)


@contextlib.contextmanager
def engine_stub() -> Iterator[str]:
    """``bench/engine_stub.py`` in a process of its own; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with process([sys.executable, "-m", "bench.engine_stub", "--port", str(port)], f"{url}/health"):
        yield url


def gateway_environment(extra: dict[str, str]) -> dict[str, str]:
    """modgate as benchmarked: production defaults (the in-flight cap of 8 included), an API key, and no
    verdict reuse: every request must reach the engine, as it does through the other arms.
    """
    return {"MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0", "MODGATE_API_KEYS": f"{MODGATE_KEY}:bench", **extra}


def arms_for(urls: dict[str, str], bodies: Requests) -> dict[str, Arm]:
    """The arms to time, with their request bytes encoded once."""
    arms: dict[str, Arm] = {}
    for name, base in urls.items():
        if name == "engine":
            url, body, headers = f"{base}/v1/chat/completions", bodies.chat, {}
        elif name.startswith("modgate"):
            url, body = f"{base}/v1/moderations", bodies.moderation
            headers = {"X-Modgate-Thinking": "off", "Authorization": f"Bearer {MODGATE_KEY}"}
        else:
            url, body = f"{base}/v1/chat/completions", {**bodies.chat, "model": SERVED_NAME}
            headers = {"Authorization": f"Bearer {LITELLM_KEY}"}
        arms[name] = Arm(url, encode_request(url, json.dumps(body).encode(), headers))
    return arms


async def check_answers(http: httpx.AsyncClient, urls: dict[str, str], bodies: Requests) -> None:
    """Each arm gives a real answer before it is timed (a fast error is not a fast gateway)."""
    for arm, url in urls.items():
        if arm.startswith("modgate"):
            response = await http.post(f"{url}/v1/moderations", json=bodies.moderation,
                                       headers={"X-Modgate-Thinking": "off",
                                                "Authorization": f"Bearer {MODGATE_KEY}"})
            # a verdict the engine made (any action: the simulator flips a share of thinking-off frames)
            ok = response.status_code == 200 and response.json()["results"][0]["modgate"]["reason"] is None
        else:
            body = bodies.chat if arm == "engine" else {**bodies.chat, "model": SERVED_NAME}
            response = await http.post(f"{url}/v1/chat/completions", json=body,
                                       headers={"Authorization": f"Bearer {LITELLM_KEY}"})
            ok = response.status_code == 200 and "[DONE]" in response.text and '"stop"' in response.text
        if not ok:
            raise RuntimeError(f"{arm} did not answer the keyframe: {response.status_code} "
                               f"{response.text[:300]}")


async def measure(urls: dict[str, str], bodies: Requests, requests: int, concurrencies: list[int],
                  rounds: int) -> dict[int, dict[str, ArmRun]]:
    """Every arm at every concurrency, in interleaved rounds."""
    async with httpx.AsyncClient(timeout=120) as http:
        await check_answers(http, urls, bodies)
    arms = arms_for(urls, bodies)
    names = list(arms)
    results: dict[int, dict[str, ArmRun]] = {}
    for concurrency in concurrencies:
        runs = {name: ArmRun() for name in names}
        for name in names:  # warm every connection and code path at this concurrency
            await closed_loop(arms[name], 2 * concurrency, concurrency, ArmRun())
        per_round = max(concurrency, requests // rounds)
        for round_no in range(rounds):
            for name in names[round_no % len(names):] + names[: round_no % len(names)]:
                await closed_loop(arms[name], per_round, concurrency, runs[name])
        results[concurrency] = runs
    await asyncio.gather(*(arm.close() for arm in arms.values()))
    return results


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else float("nan")


def summarize(results: dict[int, dict[str, ArmRun]]) -> dict[str, Any]:
    """Figures per concurrency and arm, with added latency over the engine and modgate-to-LiteLLM ratios."""
    table: dict[str, Any] = {}
    for concurrency, runs in results.items():
        figures = {arm: run.figures() for arm, run in runs.items()}
        base = figures.get("engine")
        for arm, row in figures.items():
            if base is not None and arm != "engine":
                row["added_p50_ms"] = row["p50_ms"] - base["p50_ms"]
                row["added_p99_ms"] = row["p99_ms"] - base["p99_ms"]
        over: dict[str, dict[str, float]] = {}
        if "litellm" in figures and base is not None:
            lite = figures["litellm"]
            for arm, mod in figures.items():
                if arm.startswith("modgate"):
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


def print_markdown(table: dict[str, Any]) -> None:
    """The table in Markdown, for docs/benchmarks.md: one row per concurrency, the arms side by side."""
    print("\n| clients | engine p50 / p99 ms | modgate added p50 / p99 ms | LiteLLM added p50 / p99 ms | "
          "modgate ÷ LiteLLM, added p50 / p99 | req/s engine / modgate / LiteLLM |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for concurrency, entry in table.items():
        arms, ratios = entry["arms"], entry["modgate_over_litellm"]
        if not ratios:
            continue
        engine, mod, lite = arms["engine"], arms["modgate"], arms["litellm"]
        print(f"| {concurrency} | {engine['p50_ms']:.2f} / {engine['p99_ms']:.2f} | "
              f"{mod['added_p50_ms']:.1f} / {mod['added_p99_ms']:.1f} | "
              f"{lite['added_p50_ms']:,.1f} / {lite['added_p99_ms']:,.1f} | "
              f"{ratios['added_p50']:.2f} / {ratios['added_p99']:.2f} | "
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
    print(f"{'clients':>7}  {'arm':<16}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}"
          f"{'added p50':>11}{'added p99':>11}")
    for concurrency, entry in table.items():
        for arm, row in entry["arms"].items():
            added = (f"{row['added_p50_ms']:>11.2f}{row['added_p99_ms']:>11.2f}" if "added_p50_ms" in row
                     else f"{'-':>11}{'-':>11}")
            errors = f"   {row['errors']:.0f} errors" if row["errors"] else ""
            print(f"{concurrency:>7}  {arm:<16}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['rps']:>9.1f}"
                  f"{added}{errors}")
        for arm, ratios in entry["over_litellm"].items():
            print(f"{'':>7}  {arm}/litellm: added p50 {ratios['added_p50']:.2f}x, added p99 "
                  f"{ratios['added_p99']:.2f}x, req/s {ratios['rps']:.2f}x")


@contextlib.contextmanager
def engine(kind: str) -> Iterator[str]:
    """The engine every arm talks to."""
    if kind == "stub":
        with engine_stub() as url:
            yield url
    else:
        with simulator("instant", 0.0) as url:
            yield url


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the arms, measure, stop them; answers the figures and how they were taken."""
    bodies = Requests.build(args.width, args.height)
    extra_env = dict(item.split("=", 1) for item in args.gateway_env)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        engine_url = stack.enter_context(engine(args.engine))
        urls = {"engine": engine_url}
        if "modgate" in args.arms:
            urls["modgate"] = stack.enter_context(
                gateway(engine_url, **gateway_environment(extra_env))
            )
        for workers in args.workers:  # modgate with N uvicorn worker processes (state in Redis)
            scaled_env = {**extra_env, "MODGATE_WORKERS": str(workers), "MODGATE_REDIS_URL": args.redis_url}
            urls[f"modgate:workers-{workers}"] = stack.enter_context(
                gateway(engine_url, **gateway_environment(scaled_env))
            )
        for label, *settings in args.variant:  # modgate again, with other settings, as arms of their own
            urls[f"modgate:{label}"] = stack.enter_context(gateway(engine_url, **gateway_environment(
                {**extra_env, **dict(item.split("=", 1) for item in settings)}
            )))
        if "litellm" in args.arms:
            urls["litellm"] = stack.enter_context(
                litellm_proxy(engine_url, MODEL, LITELLM_KEY, args.litellm_workers)
            )
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # the load generator kept lean
            results = runner.run(measure(urls, bodies, args.requests, args.concurrency, args.rounds))
        stub_info = httpx.get(f"{engine_url}/stub/info").json() if args.engine == "stub" else None
    return {
        "setup": {
            "engine": args.engine,
            "stub": stub_info,
            "frame": f"{bodies.frame.width}x{bodies.frame.height}",
            "image_tokens": bodies.frame.image_tokens,
            "requests_per_arm": args.requests,
            "rounds": args.rounds,
            "litellm": LITELLM_VERSION,
            "litellm_workers": args.litellm_workers,
            "gateway_env": extra_env,
            "workers": [1, *args.workers] if "modgate" in args.arms else args.workers,
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
                        help="gateways to measure (the engine arm always runs)")
    parser.add_argument("--engine", choices=("stub", "sim"), default="stub")
    parser.add_argument("--width", type=int, default=1056)
    parser.add_argument("--height", type=int, default=640)
    parser.add_argument("--litellm-workers", type=int, default=1)
    parser.add_argument("--gateway-env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra MODGATE_* settings for the gateway under test")
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar="LABEL KEY=VALUE",
                        help="another modgate arm with these settings, "
                             "e.g. --variant redis MODGATE_REDIS_URL=redis://127.0.0.1:6379/14")
    parser.add_argument("--workers", type=int, nargs="+", default=[], metavar="N",
                        help="also modgate with N worker processes, one arm per N (needs --redis-url)")
    parser.add_argument("--redis-url", default=os.environ.get("MODGATE_BENCH_REDIS_URL", ""),
                        help="Redis for the --workers arms (default $MODGATE_BENCH_REDIS_URL); "
                             "it holds their shared state")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = parser.parse_args(argv)
    if any(workers < 2 for workers in args.workers):
        parser.error("--workers takes counts of 2 or more (the plain modgate arm has 1)")
    if args.workers and not args.redis_url:
        parser.error("--workers needs --redis-url (or MODGATE_BENCH_REDIS_URL): modgate refuses to run "
                     "more than one worker without Redis")
    report = run(args)
    setup = report["setup"]
    print(f"engine: {setup['engine']}; frame {setup['frame']} ({setup['image_tokens']} image tokens), "
          f"thinking off; {args.requests} timed requests per arm and concurrency, {args.rounds} interleaved "
          "rounds; "
          f"LiteLLM {LITELLM_VERSION} ({args.litellm_workers} worker); {setup['cpus']} CPUs, load average "
          f"{setup['load_before'][0]:.1f} before, {setup['load_after'][0]:.1f} after")
    if setup["stub"]:
        print(f"engine stub: {setup['stub']['distinct_bodies']} distinct request bodies, "
              f"{setup['stub']['replays']} replayed answers")
    print_table(report["results"])
    if args.markdown:
        print_markdown(report["results"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
