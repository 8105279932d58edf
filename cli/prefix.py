"""``modgate cache plan``: prefix planning against a live engine, or the built-in simulator with a preset.

The maths is :mod:`shaping.prefix`; the measuring on the engine (``/tokenize``, ``/metrics``) is
:mod:`gateway.engine.prefix`, which the gateway also uses at start for its block-filling prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from typing import Annotated

import typer

from cli.cache_probe import VerdictFormatOption
from gateway.engine.client import EngineClient
from gateway.engine.pool_build import tool_client
from gateway.engine.prefix import (
    CachedCall,
    EngineTokens,
    PrefixPlanError,
    fill_for_format,
)
from gateway.settings import Settings, ShapingSettings
from shaping.image import ImageLimits, ShapedImage, shape_image
from shaping.prefix import FilledPrefix, GuidanceTooShort, PrefixPlan, RequestShape, plan_prefix
from shaping.prompt import SystemPrompt, load_system_prompt, prompt_version_for
from shaping.tokens import TokenGrid
from shaping.verdict import DEFAULT_VERDICT_FORMAT, VerdictFormat


@dataclass(frozen=True, slots=True)
class PlanReport:
    """``modgate cache plan``: the plan today, and with the block-filling prefix if asked."""

    engine: str
    model: str
    block_size: int
    frame: str  # "1280x720 -> 1088x608 = 646 image tokens"
    frames_per_request: int
    thinking: bool
    verdict_format: VerdictFormat  # the system prompt (and guidance) asked of the model
    system_characters: int
    plan: PrefixPlan
    filled: FilledPrefix | None = None
    filled_plan: PrefixPlan | None = None
    verified: list[CachedCall] | None = None
    verified_filled: list[CachedCall] | None = None


def _frames(width: int, height: int, grid: TokenGrid, count: int, seed: int) -> list[ShapedImage]:
    from deploy.keyframes import make_keyframe

    return [shape_image(make_keyframe("allow", width, height, seed=seed + i), ImageLimits(), grid)
            for i in range(count)]


@contextlib.contextmanager
def _engine_url(engine_url: str | None, preset: str) -> Iterator[str]:
    """The engine to plan against: the one given, or a built-in simulator started for the plan."""
    if engine_url:
        yield engine_url.rstrip("/")
        return
    from cli.embedded import ThreadedServer
    from deploy.simulator import PRESETS, create_sim_app

    with ThreadedServer(create_sim_app(PRESETS[preset], 0.0)) as server:
        yield server.url


@contextlib.asynccontextmanager
async def _client(url: str) -> AsyncIterator[EngineClient]:
    """The engine's client, as the gateway's (its settings' timeouts and kind): every request counted."""
    async with tool_client(url, Settings().engine) as client:
        yield client


async def make_plan(
    url: str,
    label: str,
    *,
    block_size: int | None,
    width: int,
    height: int,
    grid: TokenGrid,
    frames_per_request: int,
    thinking: bool,
    fill: bool,
    verify: int,
    verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT,
) -> PlanReport:
    """Measure the request shape on the engine and plan its prefix cache (and with the fill, if asked).

    The system prompt is the one that asks for ``verdict_format``; the fill uses the guidance that agrees
    with it.
    """
    shaping = ShapingSettings()
    k = frames_per_request
    user_text = shaping.user_text if k == 1 else shaping.packed_user_text.format(frames=k)
    async with _client(url) as http:
        engine = await EngineTokens.connect(http)
        prefix_reuse = (await http.wire()).prefix_reuse
        if prefix_reuse is not None:
            raise PrefixPlanError(f"{prefix_reuse}, with no block to plan for: `modgate cache probe` shows")
        size = block_size or await engine.block_size()
        if size is None:
            raise PrefixPlanError("the engine exposes no vllm:cache_config_info: pass --block-size")
        frames = await asyncio.to_thread(_frames, width, height, grid, k, 0)
        base = load_system_prompt(prompt_version_for(verdict_format))

        async def shape_of(system: SystemPrompt) -> RequestShape:
            shared = await engine.shared_prefix_tokens(system.text)
            total = await engine.prompt_tokens(system, frames, user_text, thinking)
            return RequestShape(shared, total, k)

        plan = plan_prefix(await shape_of(base), size)
        filled = filled_plan = filled_prompt = None
        if fill:
            filled_prompt, filled = await fill_for_format(engine, size, verdict_format)
            filled_plan = plan_prefix(await shape_of(filled_prompt), size)
        verified = verified_filled = None
        if verify:
            # Distinct keyframes per request: what production sends, so only the shared prefix can hit.
            seeds = [1000 * i for i in range(1, verify + 1)]
            sets = [await asyncio.to_thread(_frames, width, height, grid, k, seed) for seed in seeds]
            verified = await engine.cached_calls(base, sets, user_text, thinking, verdict_format)
            if filled_prompt is not None:
                verified_filled = await engine.cached_calls(
                    filled_prompt, sets, user_text, thinking, verdict_format
                )
    shaped = frames[0]
    return PlanReport(
        engine=label, model=engine.model, block_size=size,
        frame=f"{width}x{height} -> {shaped.width}x{shaped.height} = {shaped.image_tokens:,} image tokens",
        frames_per_request=k, thinking=thinking, verdict_format=verdict_format,
        system_characters=len(base.text), plan=plan,
        filled=filled, filled_plan=filled_plan, verified=verified, verified_filled=verified_filled,
    )


def _plan_lines(plan: PrefixPlan) -> list[str]:
    shape = plan.shape
    lines = [
        f"  shared prefix    {shape.shared_prefix_tokens:>7,} tokens (system prompt, template to the image)",
        f"  prompt           {shape.prompt_tokens:>7,} tokens per request",
        f"  from the cache   {plan.cacheable_tokens:>7,} tokens per request at most",
        f"  computed         {plan.uncached_tokens:>7,} tokens per request, "
        f"{plan.uncached_tokens_per_frame:,.0f} per keyframe",
        f"  why: {plan.reason}",
    ]
    lines += [f"  change: {change}" for change in plan.changes]
    return lines


def render_plan(report: PlanReport) -> str:
    """The plan as an operator reads it."""
    lines = [
        f"engine {report.engine}, model {report.model}, prefix-cache block {report.block_size:,} tokens",
        f"request: {report.frames_per_request} keyframe(s) of {report.frame}, thinking "
        f"{'on' if report.thinking else 'off'}, {report.verdict_format} verdict, system prompt "
        f"{report.system_characters:,} characters",
        "",
        "today:",
        *_plan_lines(report.plan),
    ]
    if report.verified:
        cached = ", ".join(f"{call.cached_tokens:,}/{call.prompt_tokens:,}" for call in report.verified)
        lines.append(f"  sent: cached/prompt tokens per request, each with its own keyframes: {cached}")
    if report.filled is not None and report.filled_plan is not None:
        filled = report.filled
        lines += [
            "",
            f"with the block-filling prefix (policy guidance, +{filled.added_tokens:,} tokens, "
            f"{len(filled.guidance):,} characters; {filled.overshoot:,} past the "
            f"{filled.target_tokens:,}-token boundary):",
            *_plan_lines(report.filled_plan),
        ]
        before, after = report.plan.uncached_tokens_per_frame, report.filled_plan.uncached_tokens_per_frame
        change = (after - before) / before
        lines.append(f"  computed per keyframe: {before:,.0f} -> {after:,.0f} ({change:+.0%})")
        if report.verified_filled:
            cached = ", ".join(f"{c.cached_tokens:,}/{c.prompt_tokens:,}" for c in report.verified_filled)
            lines.append(f"  sent: cached/prompt tokens per request, each with its own keyframes: {cached}")
    return "\n".join(lines)


def _parse_frame(value: str) -> tuple[int, int]:
    width, sep, height = value.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) < 1 or int(height) < 1:
        raise typer.BadParameter("must look like 1280x720", param_hint="--frame")
    return int(width), int(height)


def plan(
    engine_url: Annotated[
        str | None,
        typer.Option("--engine-url", help="The vLLM server; unset: the built-in simulator with --preset."),
    ] = None,
    preset: Annotated[str, typer.Option(help="Simulator preset (no --engine-url): spark, instant")] = "spark",
    block_size: Annotated[
        int | None, typer.Option(min=1, help="Prefix-cache block size (default: the engine's own).")
    ] = None,
    frame: Annotated[str, typer.Option(help="Keyframe size as sent by callers, WxH.")] = "1280x720",
    token_budget: Annotated[int, typer.Option(min=4, help="Image tokens per keyframe at most.")] = 660,
    pixels_per_token: Annotated[int, typer.Option(help="32 (Qwen3-VL) or 28 (Qwen2.5-VL).")] = 32,
    frames_per_request: Annotated[int, typer.Option(min=1, max=16, help="Keyframes packed per request.")] = 1,
    thinking: Annotated[bool, typer.Option("--thinking/--no-thinking", help="The thinking mode.")] = True,
    verdict_format: VerdictFormatOption = DEFAULT_VERDICT_FORMAT,
    fill: Annotated[bool, typer.Option("--fill", help="Also plan with the block-filling prefix.")] = False,
    verify: Annotated[
        int, typer.Option(min=0, max=20, help="Send this many requests (own keyframes); show cached_tokens.")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """How many prompt tokens per request can ever come from the prefix cache, why, and what would change."""
    from deploy.simulator import PRESETS

    if engine_url is not None and not engine_url.startswith(("http://", "https://")):
        raise typer.BadParameter("must start with http:// or https://", param_hint="--engine-url")
    if engine_url is None and preset not in PRESETS:
        raise typer.BadParameter(f"choose from {', '.join(PRESETS)}", param_hint="--preset")
    if pixels_per_token not in (28, 32):
        raise typer.BadParameter("must be 28 or 32", param_hint="--pixels-per-token")
    width, height = _parse_frame(frame)
    grid = TokenGrid(pixels_per_token=pixels_per_token, token_budget=token_budget)
    label = engine_url or f"built-in simulator ({preset} preset)"
    try:
        with _engine_url(engine_url, preset) as url:
            report = asyncio.run(make_plan(
                url, label, block_size=block_size, width=width, height=height, grid=grid,
                frames_per_request=frames_per_request, thinking=thinking, fill=fill, verify=verify,
                verdict_format=verdict_format,
            ))
    except (PrefixPlanError, GuidanceTooShort) as exc:
        typer.secho(f"cache plan failed: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
    if as_json:
        document = asdict(report)
        for name in ("filled",):
            if document[name] is not None:
                document[name].pop("system_text", None)
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        typer.echo(render_plan(report))
