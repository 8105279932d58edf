"""Prompt tokens each request computes (prompt minus cached) under each prefix strategy, through the gateway.

One run per row: an engine started with the row's flags, a gateway in front of it with the row's
``MODGATE_SHAPING__PREFIX_STRATEGY``, and ``--requests`` moderations of the gateway's real request shape
sent one after the other (text moderations on a text-only engine, keyframes on the Spark's), each with its
own content. Each answer's ``modgate.prompt_tokens`` and ``cached_tokens`` are the engine's own usage.

Rows: no strategy (``off``), block filling, ``--prefix-match-unit`` 16 and 64 with the gateway's priming
(``auto``), and llama.cpp (``auto``: nothing to do). Engines: the simulator's presets (``hybrid-cpu``, the
tiny real hybrid engine's law and block; ``spark-hybrid``, the production block) and, with
``--real``, the real hybrid engine (``modgate engine-cpu --model hybrid``, ``modgate engine-llamacpp
--model hybrid``), booted once per match unit.

    python -m bench.prefix_strategies [--requests 6] [--real] [--json docs/bench/prefix-strategies.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import shlex
import statistics
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port, process
from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from gateway.http.app import create_app
from gateway.settings import EngineSettings, Settings, ShapingSettings
from shaping.prefix_strategy import PrefixStrategySetting

STRATEGIES: tuple[tuple[str, PrefixStrategySetting, int | None], ...] = (
    # (row name, the gateway's MODGATE_SHAPING__PREFIX_STRATEGY, the engine's --prefix-match-unit)
    ("no strategy", "off", None),
    ("block filling", "block-fill", None),
    ("match unit 16 + priming", "auto", 16),
    ("match unit 64 + priming", "auto", 64),
)


@dataclass
class Row:
    """One engine and strategy: every request's prompt and cached tokens, or why it could not run."""

    engine: str
    strategy: str
    requests: list[tuple[int, int]] = field(default_factory=list)  # (prompt, cached) per request
    primings: float = 0.0
    note: str = ""

    @property
    def computed(self) -> list[int]:
        """Prompt tokens each request computed."""
        return [prompt - cached for prompt, cached in self.requests]

    def summary(self) -> dict[str, Any]:
        """The row's figures: prompt, cached and computed tokens per request after the first."""
        later = self.requests[1:]
        return {
            "engine": self.engine, "strategy": self.strategy, "note": self.note, "primings": self.primings,
            "first_computed": self.computed[0] if self.requests else None,
            "prompt_mean": statistics.fmean(p for p, _ in later) if later else None,
            "cached_mean": statistics.fmean(c for _, c in later) if later else None,
            "computed_mean": statistics.fmean(p - c for p, c in later) if later else None,
            "computed_max": max((p - c for p, c in later), default=None),
        }


def _texts(count: int, salt: str) -> list[str]:
    body = "用户发表的评论讨论了天气、路况和周末的计划，语气平和，没有提到任何人。" * 14
    return [f"{salt}第{i}条：{body}" for i in range(count)]


def _moderate(gateway_url: str, payload: Any) -> tuple[int, int]:
    response = httpx.post(f"{gateway_url}/v1/moderations", json={"model": "m", "input": payload},
                          headers={"X-Modgate-Thinking": "off"}, timeout=600)
    response.raise_for_status()
    result = response.json()["results"][0]["modgate"]
    return int(result["prompt_tokens"]), int(result["cached_tokens"])


def _payloads(count: int, salt: str, images: bool) -> list[Any]:
    if not images:
        return list(_texts(count, salt))
    import base64

    frames = [make_keyframe("allow", 1280, 720, seed=1000 + i + 97 * len(salt)) for i in range(count)]
    return [[{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," +
                                                 base64.b64encode(frame).decode()}}] for frame in frames]


def _primings(gateway_url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{gateway_url}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "modgate_prefix_primings" for sample in family.samples
               if sample.name.endswith("_total") and sample.labels.get("reason") != "failed")


def run_row(row: Row, engine_url: str, strategy: PrefixStrategySetting, count: int, images: bool) -> Row:
    """A gateway with ``strategy`` in front of the engine, ``count`` moderations through it."""
    shaping = ShapingSettings(
        prefix_strategy=strategy, verdict_cache_ttl_s=0.0, prefix_reprime_interval_s=0.0
    )
    settings = Settings(engine=EngineSettings(url=engine_url), shaping=shaping)
    gateway = ThreadedServer(create_app(settings)).start(timeout_s=900)
    try:
        for payload in _payloads(count, row.strategy + row.engine, images):
            row.requests.append(_moderate(gateway.url, payload))
        row.primings = _primings(gateway.url)
    finally:
        gateway.stop()
    return row


def simulated_rows(preset_name: str, count: int) -> Iterator[Row]:
    """Every strategy on a simulator preset, then llama.cpp's law on the same preset."""
    images = preset_name.startswith("spark")
    label = f"simulator {preset_name}"
    for name, strategy, unit in STRATEGIES:
        row = Row(label, name)
        try:
            preset = PRESETS[preset_name].scaled(prefix_match_unit=unit)
        except ValueError as exc:  # vLLM refuses the unit at start
            row.note = f"refused at start: {exc}"
            yield row
            continue
        engine = ThreadedServer(create_sim_app(preset, 0.0)).start()
        try:
            yield run_row(row, engine.url, strategy, count, images)
        finally:
            engine.stop()
    engine = ThreadedServer(create_sim_app(PRESETS[preset_name], 0.0, kind="llamacpp")).start()
    try:
        yield run_row(Row(label, "llama.cpp (auto)"), engine.url, "auto", count, images)
    finally:
        engine.stop()


@contextlib.contextmanager
def _real_engine(command: str, extra: list[str]) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, "-m", "cli.main", command, "--model", "hybrid", "--port", str(port),
            *extra]
    with process(args, f"http://127.0.0.1:{port}/health", ready_timeout_s=900):
        yield f"http://127.0.0.1:{port}"


def real_rows(count: int, units_to_run: tuple[int | None, ...], llamacpp: bool) -> Iterator[Row]:
    """Every strategy on the real hybrid vLLM (one boot per match unit), then the real llama.cpp server."""
    label = "real hybrid (vLLM CPU, block 2176)"
    for units in units_to_run:
        # -O0: torch's compile of the hybrid took over 300 s on a loaded 2-core machine (the suite's flag too)
        flags = "--optimization-level 0" + ("" if units is None else f" --prefix-match-unit {units}")
        extra = ["--vllm-args", flags]
        chosen = [s for s in STRATEGIES if s[2] == units]
        try:
            with _real_engine("engine-cpu", extra) as url:
                for name, strategy, _unit in chosen:
                    yield run_row(Row(label, name), url, strategy, count, images=False)
        except RuntimeError as exc:
            for name, _strategy, _unit in chosen:
                yield Row(label, name, note=f"engine did not start: {exc}")
    if not llamacpp:
        return
    try:
        with _real_engine("engine-llamacpp", []) as url:
            row = Row("real hybrid (llama.cpp)", "llama.cpp (auto)")
            yield run_row(row, url, "auto", count, images=False)
    except RuntimeError as exc:
        yield Row("real hybrid (llama.cpp)", "llama.cpp (auto)", note=f"server did not start: {exc}")


def table(rows: list[Row]) -> str:
    """The rows as the printed table."""
    head = (f"{'engine':<36}{'strategy':<26}{'prompt':>8}{'cached':>8}{'computed':>10}{'max':>6}"
            f"{'1st':>7}{'primed':>7}  note")
    lines = [head, "-" * len(head)]
    for row in rows:
        s = row.summary()

        def cell(value: float | None, width: int) -> str:
            return f"{'-' if value is None else f'{value:,.0f}':>{width}}"

        lines.append(f"{row.engine:<36}{row.strategy:<26}{cell(s['prompt_mean'], 8)}"
                     f"{cell(s['cached_mean'], 8)}{cell(s['computed_mean'], 10)}{cell(s['computed_max'], 6)}"
                     f"{cell(s['first_computed'], 7)}{cell(row.primings, 7)}  {row.note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the rows, print the table, write the JSON artefact if asked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6, help="moderations per row (the first is cold)")
    parser.add_argument("--real", action="store_true", help="also the real hybrid engines (minutes a boot)")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulator rows")
    parser.add_argument("--real-units", default="none,16,64",
                        help="the real vLLM's boots: match units, 'none' for no unit (comma separated)")
    parser.add_argument("--no-real-llamacpp", action="store_true", help="skip the real llama.cpp row")
    parser.add_argument("--json", type=Path, help="write the figures and the table here")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    if not args.no_sim:
        for preset in ("hybrid-cpu", "spark-hybrid"):
            rows.extend(simulated_rows(preset, args.requests))
    if args.real:
        units = tuple(None if unit == "none" else int(unit) for unit in args.real_units.split(","))
        rows.extend(real_rows(args.requests, units, not args.no_real_llamacpp))
    printed = table(rows)
    print(printed)
    document = {
        "command": "python -m bench.prefix_strategies "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {platform.system()}, {__import__('os').cpu_count()} cores",
        "columns": "per request after the first: prompt, cached and computed (prompt - cached) tokens, "
                   "their mean; max: the most one of them computed; 1st: what the first computed; primed: "
                   "priming requests the gateway sent",
        "rows": [{**row.summary(), "requests": [asdict(row)["requests"]][0]} for row in rows],
        "table": printed,
    }
    if args.json:
        args.json.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return document


if __name__ == "__main__":
    main()
