"""The ``modgate`` command line."""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from cli.cache_probe import cache_app
from cli.decisions import decisions_app
from cli.policy import policy_app
from cli.prefix import plan as cache_plan
from cli.quality import quality_app
from cli.stats import stats
from cli.video import video_app
from deploy.cli import deploy_app
from deploy.engine_cpu import engine_cpu as engine_cpu_command
from deploy.engine_llamacpp import engine_llamacpp as engine_llamacpp_command
from gateway.http.keys_store import keys_app
from gateway.http.tenants import tenants_app

if TYPE_CHECKING:
    from litestar import Litestar

    from deploy.simulator.presets import SimPreset
    from gateway.engine.wires import EngineKind
    from gateway.settings import Settings, TenantSettings

log = logging.getLogger("modgate.gateway")

app = typer.Typer(
    help="modgate: a moderation gateway in front of a vision-language model on vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(deploy_app, name="deploy")
app.add_typer(policy_app, name="policy")
app.command("engine-cpu", help="Install, build and serve the real vLLM CPU engine (tiny generated model).")(
    engine_cpu_command
)
app.command("engine-llamacpp", help="Build and serve the real llama.cpp server (tiny model as GGUF).")(
    engine_llamacpp_command
)
cache_app.command("plan")(cache_plan)  # beside `cache probe`: what the prefix cache can ever reuse
app.add_typer(cache_app, name="cache")
app.add_typer(keys_app, name="keys")
app.add_typer(tenants_app, name="tenants")
app.command("stats")(stats)
app.add_typer(quality_app, name="quality")
app.add_typer(decisions_app, name="decisions")
app.add_typer(video_app, name="video")


def _sample_body_file(url: str) -> Path:
    from deploy.keyframes import make_keyframe

    frame = base64.b64encode(make_keyframe("block:violence", seed=7)).decode()
    body = {
        "model": "modgate-moderation",
        "input": [{"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{frame}"}}],
    }
    path = Path(tempfile.gettempdir()) / "modgate-sample-keyframe.json"
    path.write_text(json.dumps(body))
    return path


@contextmanager
def engine_settings(settings: Settings) -> Iterator[Settings]:
    """The settings with an engine: the configured one, or the built-in simulator, started here until exit.

    The service never starts an engine itself: this is where the command line composes the two.
    """
    if settings.engine.url:
        yield settings
        return
    from cli.embedded import ThreadedServer
    from deploy.simulator import PRESETS, create_sim_app
    from shaping.prefix_strategy import RECOMMENDED_MATCH_UNIT

    # Started as docs/engines.md tells a real engine to start: the Spark's model is hybrid (its 2,960-token
    # block is its linear-attention state's), so it runs that cache law with --prefix-match-unit 16, which the
    # gateway primes; without the unit no request could take the shared prefix from its cache.
    preset = (PRESETS["spark-hybrid"].scaled(prefix_match_unit=RECOMMENDED_MATCH_UNIT)
              if settings.simulator.preset == "spark" else PRESETS[settings.simulator.preset])
    if settings.simulator.tokenizer is not None:
        preset = preset.scaled(tokenizer=settings.simulator.tokenizer)
    with ThreadedServer(create_sim_app(preset, settings.simulator.time_scale)) as server:
        log.info(  # the engine it asked for: `modgate serve` prints it too
            "MODGATE_ENGINE__URL is unset: using the built-in simulated engine at %s "
            "(%s preset, time scale %g)",
            server.url,
            preset.name,
            settings.simulator.time_scale,
        )
        tenants = work_weighed(settings, preset)
        engine = settings.engine.model_copy(update={"url": server.url})
        yield settings.model_copy(update={"engine": engine, "tenants": tenants})


def work_weighed(settings: Settings, preset: SimPreset) -> TenantSettings:
    """The tenants' settings with the fair share's work weight of the simulated engine's own preset, unless
    MODGATE_TENANTS__OUTPUT_TOKEN_WEIGHT was set (or the preset costs no time)."""
    weight = preset.output_token_weight
    if weight is None or "output_token_weight" in settings.tenants.model_fields_set:
        return settings.tenants
    return settings.tenants.model_copy(update={"output_token_weight": round(weight, 1)})


def served_app() -> Litestar:
    """The app as each worker process builds it (``--workers`` above 1): settings from the environment."""
    from cli.serving import PROCESS_DRAIN
    from gateway.http.app import create_app
    from gateway.settings import Settings
    from gateway.telemetry.tracing import configure_logging

    settings = Settings()
    configure_logging(settings.server.log_level, json_logs=settings.telemetry.json_logs)
    PROCESS_DRAIN.period_s = settings.server.drain_s  # the drain this worker's server begins on SIGTERM
    return create_app(settings, drain=PROCESS_DRAIN)


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default MODGATE_SERVER__HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default MODGATE_SERVER__PORT or 8080).")] = None,
    workers: Annotated[
        int,
        typer.Option(
            envvar="MODGATE_WORKERS",
            min=1,
            help="Worker processes. Each keeps its own in-flight cap and, without MODGATE_REDIS__URL, its "
            "own policy, keys, jobs and verdict cache: more than 1 needs Redis.",
        ),
    ] = 1,
) -> None:
    """Serve the gateway; with MODGATE_ENGINE__URL unset it starts the simulated engine itself."""
    import uvicorn

    from cli.http_protocol import OnePassHttpToolsProtocol
    from cli.serving import run as run_server
    from gateway.drain import Drain
    from gateway.http.app import create_app
    from gateway.settings import Settings
    from gateway.telemetry.tracing import configure_logging

    try:
        settings = Settings()
    except ValueError as exc:
        typer.secho(f"invalid settings: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    if workers > 1 and not settings.redis.url:
        typer.secho(
            "--workers above 1 needs MODGATE_REDIS__URL: without it every worker process would keep "
            "its own thinking policy, keys, jobs and verdict cache, and a policy flip would reach "
            "only one.",
            fg="red",
            err=True,
        )
        raise typer.Exit(2)
    listen = {"host": host or settings.server.host, "port": port or settings.server.port}
    settings = settings.model_copy(update={"server": settings.server.model_copy(update=listen)})
    configure_logging(settings.server.log_level, json_logs=settings.telemetry.json_logs)
    url = f"http://{settings.server.host}:{settings.server.port}"
    sample = _sample_body_file(url)
    auth = "" if not settings.auth.api_keys else " -H 'Authorization: Bearer <key>'"
    typer.echo(f"modgate listening on {url}")
    typer.echo(
        f"engine: {settings.engine.url or 'built-in simulator (spark preset)'}; "
        f"state: {settings.redis.url or 'in memory'}"
    )
    typer.echo(f"try: curl -s {url}/v1/moderations -H 'Content-Type: application/json'{auth} -d @{sample}")
    if workers > 1:
        cap = settings.engine.max_inflight
        typer.secho(
            f"{workers} workers: each admits up to MODGATE_ENGINE__MAX_INFLIGHT={cap} "
            f"engine requests, {workers * cap} in all; lower it to keep the "
            "engine's cap.",
            fg="yellow",
            err=True,
        )
    # JSON logs: uvicorn keeps no handlers of its own, so its lines reach the JSON formatter too.
    log_config = None if settings.telemetry.json_logs else uvicorn.config.LOGGING_CONFIG
    if workers > 1:
        _spawn_without_main_module()
    with engine_settings(settings) as served:
        if workers > 1 and served.engine.url:
            os.environ["MODGATE_ENGINE__URL"] = served.engine.url  # worker processes read the environment
        drain = Drain(served.server.drain_s)
        target: Litestar | str = (
            create_app(served, drain=drain) if workers == 1 else "cli.main:served_app"
        )
        config = uvicorn.Config(
            target,
            host=served.server.host,
            port=served.server.port,
            log_level=served.server.log_level,
            workers=workers,
            factory=workers > 1,
            # A worker must answer uvicorn's health check within this while it starts: importing the
            # gateway (OpenCV, scipy, OpenTelemetry, ...) takes 2 s on an idle core and over 10 s on a busy
            # one, and the default 5 s had workers killed and restarted in a loop.
            timeout_worker_healthcheck=60,
            timeout_keep_alive=served.server.keep_alive_s,  # longer than clients' pools: see Settings
            access_log=False,
            loop="uvloop",
            http=OnePassHttpToolsProtocol,  # httptools, each response in one write (cli/http_protocol.py)
            log_config=log_config,
        )
        run_server(config, drain)  # SIGTERM: drain MODGATE_SERVER__DRAIN_S, finish, exit 0 (cli/serving.py)


def _spawn_without_main_module() -> None:
    """Have uvicorn's spawned workers import the gateway only after they answer its health checks.

    A spawned process first re-imports the parent's main module (this one: the whole command line) and
    only then starts the thread that answers the supervisor's pings; on a busy machine that import outlasts
    the health check and the workers are killed and respawned in a loop. Without a main module to re-import,
    each worker imports the app in ``served_app``, with its ping thread already running.
    """
    main_module = sys.modules["__main__"]
    main_module.__spec__ = None
    if hasattr(main_module, "__file__"):
        del main_module.__file__


@app.command("engine-sim")
def engine_sim(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    preset: Annotated[
        str, typer.Option(help="spark, spark-hybrid, vllm-cpu, hybrid-cpu or instant.")
    ] = "spark",
    kind: Annotated[
        str, typer.Option(help="Whose wire and scheduling law: vllm, or llamacpp (llama-server's).")
    ] = "vllm",
    slots: Annotated[int | None, typer.Option(help="llamacpp: llama-server's --parallel slots.")] = None,
    ctx_size: Annotated[
        int | None, typer.Option(help="llamacpp: llama-server's -c, split among the slots.")
    ] = None,
    loading_s: Annotated[
        float, typer.Option(help="llamacpp: seconds every route answers 503 Loading model.")
    ] = 0.0,
    tokenizer: Annotated[
        str | None, typer.Option(help="Whose BPE counts tokens: qwen3.6 (the preset's default) or qwen2.5.")
    ] = None,
    time_scale: Annotated[
        float, typer.Option(help="Multiplies every simulated duration: 1 real pace, 0 instant.")
    ] = 1.0,
    block_size: Annotated[int | None, typer.Option(help="Prefix-cache block size in tokens.")] = None,
    prefix_match_unit: Annotated[
        int | None,
        typer.Option(help="vLLM's --prefix-match-unit: hits land on its multiples (a hybrid preset's block "
                          "must be divisible by it)."),
    ] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Sequences run at once.")] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="vLLM's --dtype: bfloat16, or float32 (a hybrid preset then answers its first "
                          "request 500 and exits, as vLLM's CPU build does)."),
    ] = None,
    disagreement: Annotated[
        float | None, typer.Option(help="Share of frames whose thinking-off verdict differs.")
    ] = None,
    separation: Annotated[
        float | None,
        typer.Option(help="AUROC of thinking-off confidence against a changed verdict (binormal, 0.85)."),
    ] = None,
    scheduling_policy: Annotated[str | None, typer.Option(help="fcfs or priority.")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="vLLM's token budget per step.")] = None,
    speculative_config: Annotated[
        str | None, typer.Option(help='vLLM\'s, e.g. \'{"method":"mtp","num_speculative_tokens":4}\'.')
    ] = None,
    long_prefill_token_threshold: Annotated[
        int | None, typer.Option(help="vLLM's prefill tokens per sequence per step.")
    ] = None,
    max_num_prefill_tokens_per_step: Annotated[
        int | None, typer.Option(help="The Spark fork's prefill tokens per step.")
    ] = None,
    max_parallel_prefills: Annotated[
        int | None, typer.Option(help="The Spark fork's sequences prefilling per step.")
    ] = None,
    prefill_compute_share: Annotated[
        float | None, typer.Option(help="The Spark fork's prefill share of a step while sequences decode.")
    ] = None,
    error_rate: Annotated[float, typer.Option(help="Fault: share of requests answered 500.")] = 0.0,
    slow_rate: Annotated[float, typer.Option(help="Fault: share of requests delayed by --slow-s.")] = 0.0,
    slow_s: Annotated[float, typer.Option(help="Fault: delay of a slow request.")] = 5.0,
    cut_stream_rate: Annotated[float, typer.Option(help="Fault: share of streams cut mid-answer.")] = 0.0,
    malformed_rate: Annotated[float, typer.Option(help="Fault: share of answers that are not JSON.")] = 0.0,
    busy_rate: Annotated[
        float, typer.Option(help="Fault: share of requests answered 503 busy (queue full, no free slot).")
    ] = 0.0,
    served_model_name: Annotated[
        str | None, typer.Option(help="vLLM's --served-model-name: the id /v1/models lists.")
    ] = None,
) -> None:
    """Serve the engine simulator, in vLLM's wire or (``--kind llamacpp``) llama-server's."""
    from dataclasses import replace

    import uvicorn

    from deploy.simulator import PRESETS, Faults, create_sim_app
    from deploy.simulator.app import SIM_WIRES, sim_options_refused
    from deploy.simulator.llamacpp_law import LlamaCppOptions

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    refused = sim_options_refused(kind, slots=slots, ctx_size=ctx_size, loading_s=loading_s)
    if refused is not None:
        raise typer.BadParameter(refused)
    options = LlamaCppOptions()
    options = replace(options, n_parallel=slots or options.n_parallel, n_ctx=ctx_size or options.n_ctx)
    changes: dict[str, object] = {}
    for name, value in (
        ("block_size", block_size),
        ("prefix_match_unit", prefix_match_unit),
        ("max_num_seqs", max_num_seqs),
        ("dtype", dtype),
        ("thinking_off_disagreement", disagreement),
        ("separation_auroc", separation),
        ("scheduling_policy", scheduling_policy),
        ("model", served_model_name),
    ):
        if value is not None:
            changes[name] = value
    if dtype not in (None, "bfloat16", "float32"):
        raise typer.BadParameter(f"unknown dtype {dtype!r}; choose bfloat16 or float32")
    if tokenizer is not None:
        from shaping.bpe import FAMILIES

        if tokenizer not in FAMILIES:
            raise typer.BadParameter(f"unknown tokenizer {tokenizer!r}; choose from {', '.join(FAMILIES)}")
        changes["tokenizer"] = tokenizer
    engine_flags = {
        name: None if value is None else str(value)
        for name, value in (
            ("--max-num-batched-tokens", max_num_batched_tokens),
            ("--speculative-config", speculative_config),
            ("--long-prefill-token-threshold", long_prefill_token_threshold),
            ("--max-num-prefill-tokens-per-step", max_num_prefill_tokens_per_step),
            ("--max-parallel-prefills", max_parallel_prefills),
            ("--prefill-compute-share", prefill_compute_share),
        )
        if value is not None
    }
    if engine_flags:
        from deploy.predict import FlagValueError, options_from_flags

        try:
            changes.update(options_from_flags(engine_flags))
        except FlagValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    try:
        chosen = PRESETS[preset].scaled(**changes)
    except ValueError as exc:  # what vLLM refuses at start (an invalid --prefix-match-unit)
        raise typer.BadParameter(str(exc)) from exc
    faults = Faults(
        error_rate=error_rate,
        slow_rate=slow_rate,
        slow_s=slow_s,
        cut_stream_rate=cut_stream_rate,
        malformed_rate=malformed_rate,
        busy_rate=busy_rate,
    )
    wire = SIM_WIRES[kind]
    typer.echo(
        f"engine simulator ({chosen.name} preset, {wire}, time scale {time_scale:g}) on http://{host}:{port}"
    )
    servers: list[uvicorn.Server] = []  # the app exits it as vLLM exits when its engine core dies

    def engine_core_died() -> None:
        typer.echo("engine core died (a hybrid model in float32): exiting, as vLLM does", err=True)
        servers[0].should_exit = True

    app_ = create_sim_app(
        chosen, time_scale, faults, kind=cast("EngineKind", kind),
        llamacpp=options, loading_s=loading_s, on_exit=engine_core_died, say_counts_on_stop=True,
    )
    servers.append(uvicorn.Server(uvicorn.Config(
        app_, host=host, port=port, log_level="warning", access_log=False, loop="uvloop", http="httptools",
    )))
    servers[0].run()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
