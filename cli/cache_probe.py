"""``modgate cache probe``: does the engine's prefix cache hit for the requests production actually sends?

It sends a repeated probe (one production-shaped request, the same keyframe each time) and a
production-shaped request with a keyframe of its own, reads each answer's ``cached_tokens`` and the change
of the engine's ``vllm:prefix_cache_*`` counters across the run, and says why the cache hits or cannot:
the engine hashes full KV blocks only and always recomputes the last prompt token, so a request reuses at
most ``floor((n - 1) / B) * B`` tokens, and requests with different images share only the blocks that end
before the image (docs/spark.md). Block size comes from ``vllm:cache_config_info`` where the engine exposes
it, or from ``--block-size``.

On llama.cpp's ``llama-server`` (detected from ``/props``, as the gateway does) there is no block: a
request reuses, token by token, the common prefix of the slot it lands on (all but the last token; on a
hybrid model only back to a context checkpoint), and the counters are ``llamacpp:prompt_tokens_total``
(processed) and ``llamacpp:prompt_tokens_cached_total``; the diagnosis names its settings instead.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

import httpx
import typer

from gateway.engine.client import EngineClient
from gateway.engine.pool_build import tool_client
from gateway.engine.wires import DEFAULT_KIND, WIRES, EngineWire, read_cache_config, wire_for
from gateway.errors import ModgateError, UpstreamError
from gateway.settings import Settings, ShapingSettings
from gateway.telemetry.windows import EngineCacheCounters, read_engine_cache_counters
from shaping.image import ImageLimits, ShapedImage, shape_image
from shaping.prefix_strategy import MATCH_UNIT_FIX, EngineCacheConfig, primed_cached_tokens
from shaping.prompt import (
    RequestOptions,
    SystemPrompt,
    build_chat_request,
    load_system_prompt,
    prompt_version_for,
)
from shaping.tokens import TokenGrid
from shaping.verdict import DEFAULT_VERDICT_FORMAT, VerdictFormat

cache_app = typer.Typer(help="The engine's prefix cache: probe what it reuses.", no_args_is_help=True)

# The verdict form the requests ask for, hence their system prompt: the gateway's default unless told.
VerdictFormatOption = Annotated[
    VerdictFormat,
    typer.Option("--verdict-format", help="The verdict form asked for (its system prompt): compact or json."),
]


@dataclass(frozen=True, slots=True)
class ProbeCall:
    """One engine call of the probe and what its answer said about the cache."""

    label: str
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class CacheProbeReport:
    """What the probe saw, and the diagnosis drawn from it."""

    engine_url: str
    model: str
    verdict_format: VerdictFormat
    block_size: int | None
    block_size_from: Literal["engine", "flag"] | None
    shared_prefix_tokens: int | None  # the system message as rendered: a few tokens short of the image
    repeated: list[ProbeCall]
    production: ProbeCall
    counters_before: EngineCacheCounters | None
    counters_after: EngineCacheCounters | None
    engine_kind: str = DEFAULT_KIND  # the engine's wire (gateway/engine/wires/): a label, read through it
    cache_config: EngineCacheConfig | None = None  # vllm:cache_config_info: match unit, hybrid mode
    diagnosis: list[str] = field(default_factory=list)

    @property
    def counter_hits(self) -> float | None:
        """Increase of ``vllm:prefix_cache_hits_total`` across the probe (tokens)."""
        if self.counters_before is None or self.counters_after is None:
            return None
        return self.counters_after.hits - self.counters_before.hits

    @property
    def counter_queries(self) -> float | None:
        """Increase of ``vllm:prefix_cache_queries_total`` across the probe (tokens)."""
        if self.counters_before is None or self.counters_after is None:
            return None
        return self.counters_after.queries - self.counters_before.queries


def max_reusable_tokens(prompt_tokens: int, block_size: int, shared_tokens: int | None = None) -> int:
    """Most tokens a request can take from the cache: whole blocks, never the last prompt token.

    ``shared_tokens`` limits it to a prefix other requests also have (the part before the image).
    """
    usable = prompt_tokens - 1 if shared_tokens is None else min(shared_tokens, prompt_tokens - 1)
    return max(0, usable) // block_size * block_size


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "n/a"


def _wire_of(report: CacheProbeReport) -> EngineWire:
    """The wire of the probed engine (its kind as the client detected it; before that the default's)."""
    return WIRES.get(report.engine_kind) or wire_for(DEFAULT_KIND)


def diagnose(report: CacheProbeReport) -> list[str]:
    """Plain sentences: why the cache hits, or why it cannot."""
    lines: list[str] = []
    block = report.block_size
    n = report.production.prompt_tokens
    repeated = report.repeated[-1]
    shared = report.shared_prefix_tokens
    hits = report.counter_hits
    said = _wire_of(report).cache_probe
    if block is None and said.no_block is None:
        lines.append("block size unknown: the engine exposes no vllm:cache_config_info; pass --block-size")
    if repeated.cached_tokens > 0:
        lines.append(
            f"the repeated probe reused {repeated.cached_tokens:,} of {repeated.prompt_tokens:,} tokens: "
            "prefix caching works for identical requests"
        )
    elif said.repeat_missed:
        lines.append(said.repeat_missed)
    elif block is not None and max_reusable_tokens(repeated.prompt_tokens, block) == 0:
        relation = ">" if block > repeated.prompt_tokens else "≥"
        lines.append(
            f"block {block:,} {relation} request {repeated.prompt_tokens:,} tokens: the prefix cache cannot "
            "hit (only full blocks are hashed, and the last prompt token is always recomputed)"
        )
    elif hits:
        lines.append(
            "the engine's counters show hits but cached_tokens was 0 in every answer: start vLLM with "
            "--enable-prompt-tokens-details to see per-request cached_tokens"
        )
    else:
        full_blocks = 0 if block is None else (repeated.prompt_tokens - 1) // block
        spanned = "" if block is None else f" although it spans {full_blocks:,} full blocks"
        lines.append(
            f"the repeated probe got no cached tokens{spanned}: prefix caching looks off "
            "(--enable-prefix-caching) or its blocks were evicted between calls"
        )
    production = report.production
    if production.cached_tokens > 0:
        lines.append(
            f"production-shaped requests reuse {production.cached_tokens:,} of {n:,} prompt tokens "
            f"({_share(production.cached_tokens, n)}): the shared prefix hits"
        )
    elif said.production_missed:
        lines.append(said.production_missed.format(n=n))
    elif block is not None and shared is not None and max_reusable_tokens(n, block, shared) == 0:
        lines.append(
            f"block {block:,} > shared prefix {shared:,} tokens: requests with different keyframes share no "
            "full block, so production gets 0 cached tokens whatever the since-start hit rate says "
            "(pad the shared prefix to whole blocks, or serve with a smaller block)"
        )
    elif block is not None and shared is not None:
        lines.append(
            f"the shared prefix ({shared:,} tokens) spans {shared // block:,} full blocks, yet the "
            f"production-shaped request got 0 of {n:,} tokens from the cache: the prefix is not identical "
            "across requests, or its blocks were evicted"
        )
    else:
        lines.append(f"the production-shaped request got 0 of {n:,} tokens from the cache")
    return lines + hybrid_diagnosis(report)


def hybrid_diagnosis(report: CacheProbeReport) -> list[str]:
    """A hybrid model's case (linear-attention states kept only at block boundaries and prompt ends): the
    block against the shared prefix and the prompt, the match unit, primed or not, and the fix."""
    config, shared, block = report.cache_config, report.shared_prefix_tokens, report.block_size
    if config is None or not config.hybrid or shared is None or block is None:
        return []
    n, cached = report.production.prompt_tokens, report.production.cached_tokens
    unit = config.match_unit
    lines = [
        f"hybrid model (mamba_cache_mode {config.mamba_cache_mode}): a request hits only where the engine "
        f"kept a linear-attention state: block boundaries (every {block:,} tokens) and a prompt's last "
        f"{'match-unit' if unit else 'block'} boundary"
    ]
    if unit is None:
        if block > shared:
            lines.append(
                f"block {block:,} > shared prefix {shared:,} tokens (prompt {n:,}) and no match unit: no "
                f"request can hit the shared prefix; fix: {MATCH_UNIT_FIX} and leave "
                "MODGATE_SHAPING__PREFIX_STRATEGY=auto (the gateway primes it), or fill the prefix to "
                f"{block:,} tokens (MODGATE_SHAPING__PREFIX_STRATEGY=block-fill)"
            )
        return lines
    expected = primed_cached_tokens(shared, unit)
    if cached >= expected > 0:
        lines.append(
            f"match unit {unit}: primed, the state at the shared prefix is kept; each request takes "
            f"{cached:,} tokens from the cache ({expected:,} of the shared prefix)"
        )
    else:
        lines.append(
            f"match unit {unit}, but not primed: the production-shaped request took {cached:,} of the "
            f"{expected:,} tokens it could; only a request whose prompt ends at the shared prefix keeps a "
            "state there: start the gateway with MODGATE_SHAPING__PREFIX_STRATEGY=auto (it primes at start "
            "and after every restart), and check modgate_prefix_primings_total"
        )
    if config.shared_prefix_checkpoint:
        lines.append("--enable-mamba-shared-prefix-checkpoint is on: it takes effect only with EAGLE drafts")
    return lines


def _keyframe(seed: int, shaping: ShapingSettings) -> ShapedImage:
    from deploy.keyframes import make_keyframe

    limits = ImageLimits(max_bytes=shaping.max_image_bytes, animated=shaping.animated)
    grid = TokenGrid(pixels_per_token=shaping.pixels_per_token, token_budget=shaping.image_token_budget)
    return shape_image(make_keyframe("allow", seed=seed), limits, grid, jpeg_quality=shaping.jpeg_quality)


async def _cache_config(engine: EngineClient) -> EngineCacheConfig | None:
    try:
        return read_cache_config(await engine.metrics_text())
    except (ModgateError, ValueError):
        return None


async def _counters(engine: EngineClient) -> EngineCacheCounters | None:
    try:
        return read_engine_cache_counters(await engine.metrics_text())
    except (ModgateError, ValueError):
        return None


async def _shared_prefix_tokens(engine: EngineClient, model: str, system: SystemPrompt) -> int | None:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system.text}],
        "add_generation_prompt": False,
    }
    try:
        return await engine.tokenize(body)
    except (ModgateError, KeyError, ValueError):
        return None


async def probe_engine(
    engine_url: str,
    *,
    block_size: int | None = None,
    model: str | None = None,
    repeats: int = 2,
    seed: int | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT,
) -> CacheProbeReport:
    """Run the probe against one engine; ``block_size`` overrides what the engine says.

    Its requests are production's for ``verdict_format``: that form's system prompt and output constraint.
    """
    shaping = ShapingSettings()
    rng = random.Random(seed)
    system = load_system_prompt(prompt_version_for(verdict_format))
    probe_frame, production_frame = (_keyframe(rng.randrange(1 << 30), shaping) for _ in range(2))
    engine = tool_client(engine_url, Settings().engine, transport)  # counted, as the gateway's calls
    try:
        served = model or next(iter(await engine.model_ids()), None)
        if served is None:
            raise UpstreamError(f"the engine at {engine_url} serves no model")
        before = await _counters(engine)
        shared = await _shared_prefix_tokens(engine, served, system)
        options = RequestOptions(
            model=served, enable_thinking=False, max_completion_tokens=16, stream=False,
            verdict_format=verdict_format,
        )

        async def call(label: str, frame: ShapedImage) -> ProbeCall:
            body = build_chat_request(system, [frame], shaping.user_text, options)
            answer = await engine.chat(body, f"modgate-cache-probe-{label.replace(' ', '-')}")
            return ProbeCall(label, answer.usage.prompt_tokens, answer.usage.cached_tokens)

        repeated = [await call(f"repeated probe {i + 1}", probe_frame) for i in range(max(2, repeats))]
        production = await call("production-shaped", production_frame)
        after = await _counters(engine)
        config = await _cache_config(engine)
        kind = engine.kind
    finally:
        await engine.aclose()
    seen = after or before
    exposed = seen.block_size if seen is not None else None
    chosen = block_size or exposed
    report = CacheProbeReport(
        engine_url=engine_url, model=served, verdict_format=verdict_format, block_size=chosen,
        block_size_from="flag" if block_size else ("engine" if exposed else None),
        shared_prefix_tokens=shared, repeated=repeated, production=production,
        counters_before=before, counters_after=after, engine_kind=kind, cache_config=config,
    )
    report.diagnosis.extend(diagnose(report))
    return report


def render_report(report: CacheProbeReport) -> str:
    """The probe as an operator reads it."""
    sources = {"engine": " (vllm:cache_config_info)", "flag": " (--block-size)", None: ""}
    source = sources[report.block_size_from]
    block = f"{report.block_size:,} tokens{source}" if report.block_size else "unknown"
    said = _wire_of(report).cache_probe
    if said.no_block and not report.block_size:
        block = said.no_block
    shared = report.shared_prefix_tokens
    lines = [
        f"engine {report.engine_url}, model {report.model}, {report.verdict_format} verdict",
        f"KV block: {block}",
        "shared prefix: "
        + ("unknown" if shared is None else f"about {shared:,} tokens (the system message, then a header)"),
        "",
        f"{'request':<24}{'prompt':>10}{'cached':>10}",
    ]
    for call in [*report.repeated, report.production]:
        lines.append(f"{call.label:<24}{call.prompt_tokens:>10,}{call.cached_tokens:>10,}")
    lines.append("")
    hits, queries = report.counter_hits, report.counter_queries
    if hits is None or queries is None:
        lines.append(f"engine counters: {said.counter_names} not readable")
    else:
        lines.append(
            f"engine counters across the probe: {hits:,.0f} hits / {queries:,.0f} queried tokens "
            f"({_share(hits, queries)}; includes any other traffic meanwhile)"
        )
        since_start = report.counters_after.since_start_ratio if report.counters_after else None
        if since_start is not None:
            lines.append(
                f"engine since start: {100 * since_start:.1f} % (cumulative since start: not what production "
                "gets now; watch modgate_window_engine_prefix_cache_hit_ratio instead)"
            )
    lines += ["", "diagnosis:", *(f"  - {line}" for line in report.diagnosis)]
    return "\n".join(lines)


def _report_json(report: CacheProbeReport) -> dict[str, Any]:
    document = asdict(report)
    document["counter_hits"] = report.counter_hits
    document["counter_queries"] = report.counter_queries
    return document


@cache_app.command("probe")
def probe(
    engine_url: Annotated[
        str, typer.Option("--engine-url", help="The engine (vLLM or llama-server), e.g. http://127.0.0.1:8000.")
    ],
    block_size: Annotated[
        int | None, typer.Option(min=1, help="KV block size in tokens, when the engine does not expose it.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Served model (default: the first listed).")] = None,
    repeats: Annotated[int, typer.Option(min=2, max=10, help="Times the repeated probe is sent.")] = 2,
    verdict_format: VerdictFormatOption = DEFAULT_VERDICT_FORMAT,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Send a repeated probe and a production-shaped request; say whether the prefix cache can hit."""
    if not engine_url.startswith(("http://", "https://")):
        raise typer.BadParameter("must start with http:// or https://", param_hint="--engine-url")
    try:
        report = asyncio.run(probe_engine(
            engine_url, block_size=block_size, model=model, repeats=repeats, verdict_format=verdict_format
        ))
    except ModgateError as exc:
        typer.secho(f"cache probe failed: {exc.message}", fg="red", err=True)
        raise typer.Exit(1) from exc
    typer.echo(json.dumps(_report_json(report), indent=2) if as_json else render_report(report))
