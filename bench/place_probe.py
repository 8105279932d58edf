"""What llama.cpp's verdict-place probe costs: engine calls and prompt tokens computed per verdict.

A gateway in front of a llama.cpp engine (the real ``llama-server`` that ``modgate engine-llamacpp`` builds,
and the simulator's llama.cpp wire) through a counting proxy: ``--frames`` keyframes asked with thinking
off, packed 1 and 2 to an engine call. The proxy counts the gateway's chat completions (a probe is the one
asking a single token read after the sampler chain, ``post_sampling_probs``); the prompt tokens the engine
computed are its ``llamacpp:prompt_tokens_total`` delta (cached tokens excluded). Each verdict's
confidence is exact or null with its code (shaping.confidence).

    python -m bench.place_probe [--frames 8] [--no-real] [--engine-url URL] [--probes 2]
                                [--json docs/bench/place-probe.json]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import free_port, process
from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from gateway.http.app import create_app
from gateway.settings import EngineSettings, Settings, ShapingSettings

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class Calls:
    """The chat completions the proxy passed on: the verdicts' calls and the probes."""

    verdict: int = 0
    probe: int = 0


class CountingProxy:
    """An ASGI app that forwards every request to ``upstream`` and counts them: by path, and the chat
    completions by what they are (a verdict, or a place probe)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.calls = Calls()
        self.paths: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.paths[scope["path"]] += 1
        if scope["path"] == "/v1/chat/completions":
            sent = json.loads(body)
            if sent.get("post_sampling_probs"):
                self.calls.probe += 1
            else:
                self.calls.verdict += 1
        skip = {b"host", b"content-length"}
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k.lower() not in skip}
        query = scope["query_string"].decode()
        url = self.upstream + scope["path"] + (f"?{query}" if query else "")
        async with httpx.AsyncClient(timeout=600) as client:
            response = await client.request(scope["method"], url, content=body, headers=headers)
        drop = {"content-length", "transfer-encoding", "content-encoding", "connection"}
        await send({
            "type": "http.response.start", "status": response.status_code,
            "headers": [
                (k.encode(), v.encode()) for k, v in response.headers.items() if k.lower() not in drop
            ],
        })
        await send({"type": "http.response.body", "body": response.content})


@dataclass
class Row:
    """One engine and packing: the counts and every verdict's confidence (None: null)."""

    engine: str
    packing: int
    probes: int
    verdicts: int = 0
    calls: Calls = field(default_factory=Calls)
    prompt_tokens_computed: float | None = None
    confidences: list[float | None] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Per verdict: engine calls, probes, prompt tokens computed; the share exact; the median."""
        read = [c for c in self.confidences if c is not None]
        per = max(1, self.verdicts)
        return {
            "engine": self.engine, "packing": self.packing, "place_probes": self.probes,
            "verdicts": self.verdicts,
            "calls_per_verdict": (self.calls.verdict + self.calls.probe) / per,
            "probes_per_verdict": self.calls.probe / per,
            "prompt_tokens_computed_per_verdict": (
                None if self.prompt_tokens_computed is None else self.prompt_tokens_computed / per
            ),
            "exact_share": len(read) / per,
            "null_share": (self.verdicts - len(read)) / per,
            "median_confidence": statistics.median(read) if read else None,
            "null_reasons": sorted({r.partition(":")[0] for r in self.reasons if r}),
        }


def prompt_tokens_total(engine_url: str) -> float | None:
    """llama-server's ``llamacpp:prompt_tokens_total`` (prompt tokens it computed, cached excluded)."""
    with contextlib.suppress(httpx.HTTPError):
        text = httpx.get(f"{engine_url}/metrics", timeout=30).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in {"llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens"}:
                    return float(sample.value)
    return None


def run_row(engine: str, engine_url: str, packing: int, frames: int, probes: int, salt: int) -> Row:
    """``frames`` keyframes through a gateway (behind the counting proxy) in calls of ``packing``."""
    row = Row(engine, packing, probes, verdicts=frames)
    proxy = CountingProxy(engine_url)
    proxied = ThreadedServer(proxy).start()
    settings = Settings(
        # a loaded 2-core machine's prefill of a keyframe can take longer than the default deadlines
        engine=EngineSettings(url=proxied.url, kind="llamacpp", place_probes=probes, startup_check=False,
                              first_token_timeout_s=600.0, total_timeout_s=1200.0),
        shaping=ShapingSettings(verdict_cache_ttl_s=0.0, prefix_strategy="off"),
    )
    gateway = ThreadedServer(create_app(settings)).start(timeout_s=900)
    try:
        before_calls = Calls(**asdict(proxy.calls))  # the gateway's start-up reads, if any
        before = prompt_tokens_total(engine_url)
        labels = [("allow", "block:violence")[n % 2] for n in range(frames)]
        images = [base64.b64encode(make_keyframe(label, 640, 360, seed=salt + n)).decode()
                  for n, label in enumerate(labels)]
        body = {
            "frames": [{"image_url": {"url": "data:image/jpeg;base64," + image}, "timestamp_ms": 500 * n}
                       for n, image in enumerate(images)],
            "packing": packing, "thinking": "off",
        }
        response = httpx.post(f"{gateway.url}/v1/videos/bench-{salt}/keyframes", json=body, timeout=1800)
        response.raise_for_status()
        after = prompt_tokens_total(engine_url)
        row.calls = Calls(proxy.calls.verdict - before_calls.verdict, proxy.calls.probe - before_calls.probe)
        if before is not None and after is not None:
            row.prompt_tokens_computed = after - before
        for frame in response.json()["frames"]:
            row.confidences.append(frame["modgate"]["confidence"])
            row.reasons.append(frame["modgate"]["confidence_reason"] or "")
    finally:
        gateway.stop()
        proxied.stop()
    return row


@contextlib.contextmanager
def real_llamacpp() -> Iterator[str]:
    """The real llama-server (``modgate engine-llamacpp``, the tiny vision model) on a free port."""
    port = free_port()
    args = [sys.executable, "-m", "cli.main", "engine-llamacpp", "--port", str(port)]
    with process(args, f"http://127.0.0.1:{port}/health", ready_timeout_s=900):
        yield f"http://127.0.0.1:{port}"


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| engine | packing | PLACE_PROBES | verdicts | engine calls / verdict | of them probes | "
        "prompt tokens computed / verdict | exact | null | median confidence |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row.summary()
        computed, median = s["prompt_tokens_computed_per_verdict"], s["median_confidence"]
        computed_cell = "n/a" if computed is None else f"{computed:.0f}"
        median_cell = "n/a" if median is None else f"{median:.4f}"
        lines.append(
            f"| {row.engine} | {row.packing} | {row.probes} | {row.verdicts} | "
            f"{s['calls_per_verdict']:.2f} | "
            f"{s['probes_per_verdict']:.2f} | {computed_cell} | {s['exact_share']:.0%} | "
            f"{s['null_share']:.0%} | {median_cell} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the rows, print the table, write the JSON artefact if asked."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=8, help="keyframes (verdicts) per row")
    parser.add_argument("--probes", type=int, default=2,
                        help="MODGATE_ENGINE__PLACE_PROBES (each row is also run with 0)")
    parser.add_argument("--no-real", action="store_true", help="the simulator only")
    parser.add_argument("--engine-url", help="a llama-server already up (instead of booting one)")
    parser.add_argument("--json", help="write the figures and the table here")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    simulator = ThreadedServer(create_sim_app(PRESETS["hybrid-cpu"], 0.0, kind="llamacpp")).start()
    try:
        for packing in (1, 2):
            rows.append(run_row("simulator (llama.cpp wire)", simulator.url, packing, args.frames,
                                args.probes, 100 * packing))
    finally:
        simulator.stop()
    if not args.no_real:
        with contextlib.ExitStack() as stack:
            url = args.engine_url or stack.enter_context(real_llamacpp())
            for packing in (1, 2):
                for probes in (0, args.probes):
                    rows.append(run_row("llama-server (tiny VLM)", url, packing, args.frames, probes,
                                        1000 + 100 * packing + 10 * probes))
    printed = table(rows)
    print(printed)
    document = {
        "command": "python -m bench.place_probe " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {platform.system()}, {os.cpu_count()} cores",
        "columns": "per verdict (keyframe): the gateway's chat completions to the engine (the verdicts' "
                   "calls and the place probes), the prompt tokens the engine computed "
                   "(llamacpp:prompt_tokens_total delta, cached excluded); the share of verdicts whose "
                   "confidence is exact and null; the median of the exact ones",
        "rows": [{**row.summary(), "confidences": row.confidences} for row in rows],
        "table": printed,
    }
    if args.json:
        with open(args.json, "w") as out:
            out.write(json.dumps(document, indent=2) + "\n")
    return document


if __name__ == "__main__":
    main()
