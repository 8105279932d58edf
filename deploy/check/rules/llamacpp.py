"""Rules on llama.cpp's server (`deploy/spark/compose.llamacpp.yaml`): its own pitfalls, read from its source.

Its settings are read as the server reads them (`deploy.check.llamacpp`: aliases, `LLAMA_ARG_*`
variables, defaults); why each matters is in docs/engineering.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from deploy.check.compose import Deployment
from deploy.check.llamacpp import AUTO_SLOTS, ServerSetting, server_settings, slots
from deploy.check.model import DEFAULT_MAX_INFLIGHT, Finding, Location, Service, gateway_setting
from deploy.check.rules.gateway import _engine_for, _setting

SEED_PROMPT_TOKENS = 1076  # the seed's request: 416 system + 660 image tokens
SEED_IMAGE_TOKENS = 660
DEFAULT_IMAGE_TOKEN_BUDGET = 660  # gateway/settings/request_path.py ShapingSettings.image_token_budget
DEFAULT_MAX_THINKING_OUTPUT = 512  # gateway/settings/engine.py EngineSettings.max_completion_tokens_thinking
_LAYERS_VARIABLE = "MODEL_LAYERS"  # the GGUF's block count, from .env.llamacpp (compose does not read it)


def _settings(engine: Service) -> dict[str, ServerSetting]:
    flags = [(f.key, f.value, f.negated, (f.value_arg or f.arg).location) for f in engine.flags]
    return server_settings(flags, {name: entry.value for name, entry in engine.environment.items()})


def _at(setting: ServerSetting | None, engine: Service) -> Location:
    if setting is not None and setting.location is not None:
        return setting.location
    return engine.command_location or engine.location


def _int(setting: ServerSetting | None) -> int | None:
    try:
        return int(setting.value or "") if setting is not None else None
    except ValueError:
        return None


def _gateway_of(deployment: Deployment, engine: Service) -> Service | None:
    return next((gateway for gateway in deployment.gateways
                 if _engine_for(gateway, deployment.llamacpp_engines) is engine), None)


def slot_context(deployment: Deployment) -> Iterator[Finding]:
    """llamacpp-slot-context: `-c` is split among the slots; a slot's share must hold prompt and output."""
    for engine in deployment.llamacpp_engines:
        settings = _settings(engine)
        context = settings.get("--ctx-size")
        total = _int(context)
        if context is None or total == 0:
            continue  # the model's training context, split among the slots: far above a keyframe's needs
        count, unified = slots(settings)
        if total is None:
            yield Finding("error", "llamacpp-slot-context", f"-c {context.value!r}: not a whole number",
                          _at(context, engine))
            continue
        per_slot = total if unified else -(-(total // count) // 256) * 256
        gateway = _gateway_of(deployment, engine)
        budget = _gateway_int(gateway, "MODGATE_SHAPING__IMAGE_TOKEN_BUDGET", DEFAULT_IMAGE_TOKEN_BUDGET)
        output = _gateway_int(gateway, "MODGATE_ENGINE__MAX_COMPLETION_TOKENS_THINKING",
                              DEFAULT_MAX_THINKING_OUTPUT)
        needed = SEED_PROMPT_TOKENS - SEED_IMAGE_TOKENS + budget + output
        if per_slot < needed:
            split = "shared by" if unified else f"split among the {count} slots ({total} / {count})"
            yield Finding(
                "error",
                "llamacpp-slot-context",
                f"-c {total} is {split}: {per_slot} tokens a slot, below one keyframe's {needed} (prompt "
                f"{needed - output} at {budget} image tokens + up to {output} output): llama-server refuses "
                f"the prompt or cuts the verdict; give -c {needed * count} or more",
                _at(context, engine),
            )


def _gateway_int(gateway: Service | None, name: str, default: int) -> int:
    entry = _setting(gateway, name) if gateway is not None else None
    try:
        return int(entry.value or "") if entry is not None else default
    except ValueError:
        return default


def slots_vs_cap(deployment: Deployment) -> Iterator[Finding]:
    """llamacpp-slots: the gateway's MODGATE_ENGINE__MAX_INFLIGHT above the server's slots (`--parallel`)."""
    for engine in deployment.llamacpp_engines:
        gateway = _gateway_of(deployment, engine)
        if gateway is None:
            continue
        settings = _settings(engine)
        count, _ = slots(settings)
        entry = gateway_setting(gateway.environment, "MODGATE_ENGINE__MAX_INFLIGHT")
        try:
            cap = int(entry.value or "") if entry is not None else DEFAULT_MAX_INFLIGHT
        except ValueError:
            continue  # the max-inflight rule reports an unreadable cap
        if cap > count:
            given = settings.get("--parallel")
            slots_said = f"--parallel {given.value}" if given is not None else (
                f"no --parallel (the server's auto: {AUTO_SLOTS} slots)")
            yield Finding(
                "error",
                "llamacpp-slots",
                f"MODGATE_ENGINE__MAX_INFLIGHT {cap} of `{gateway.name}` is above the {count} slots of "
                f"`{engine.name}` ({slots_said}): the excess waits in llama-server's task queue, first "
                "come first served, outside the gateway's priority queue and deadlines",
                entry.location if entry is not None else gateway.location,
                (_at(given, engine),),
            )


def prompt_cache(deployment: Deployment) -> Iterator[Finding]:
    """llamacpp-prompt-cache: a prompt cache that cannot reuse the shared system prompt."""
    for engine in deployment.llamacpp_engines:
        settings = _settings(engine)
        cache = settings.get("--cache-prompt")
        if cache is not None and not cache.on:
            yield Finding(
                "error", "llamacpp-prompt-cache",
                "prompt caching is off: every keyframe computes the 416-token system prompt again (the only "
                "part of the seed's prompt a slot can reuse)", _at(cache, engine))
        checkpoints = settings.get("--ctx-checkpoints")
        if _int(checkpoints) == 0:
            yield Finding(
                "error", "llamacpp-prompt-cache",
                "--ctx-checkpoints 0 on the Spark's hybrid model: its recurrent (linear-attention) state "
                "cannot be rolled back to the shared prefix, so without a checkpoint saved there every "
                "prompt is computed from the start (server-context.cpp: 'forcing full prompt re-processing')",
                _at(checkpoints, engine))
        reuse = settings.get("--cache-reuse")
        if reuse is not None and (_int(reuse) or 0) > 0 and "--mmproj" in settings:
            yield Finding(
                "warning", "llamacpp-prompt-cache",
                f"--cache-reuse {reuse.value} does nothing with a vision projector: llama-server turns KV "
                "shifting off for multimodal models (and for recurrent ones)", _at(reuse, engine))


def gpu_layers(deployment: Deployment) -> Iterator[Finding]:
    """llamacpp-gpu-layers: layers left on the CPU (`-ngl` below the model's layer count, or auto)."""
    for engine in deployment.llamacpp_engines:
        setting = _settings(engine).get("--gpu-layers")
        value = (setting.value or "").lower() if setting is not None else "auto"
        if value == "all":
            continue
        if value == "auto":
            yield Finding(
                "warning", "llamacpp-gpu-layers",
                "-ngl auto (the default) fits layers to the memory free at start and may leave some on the "
                "CPU: give -ngl 999 (all) so the whole model runs on the GB10", _at(setting, engine))
            continue
        layers = _int(setting)
        known = deployment.variables.get(_LAYERS_VARIABLE, "")
        if layers is None:
            yield Finding("error", "llamacpp-gpu-layers", f"-ngl {value!r}: a number, auto or all",
                          _at(setting, engine))
        elif known.isdigit() and layers < int(known):
            yield Finding(
                "error", "llamacpp-gpu-layers",
                f"-ngl {layers} is below the model's {known} layers ({_LAYERS_VARIABLE}): "
                f"{int(known) - layers} run on the Spark's CPU cores, far slower than the GB10: give "
                "-ngl 999", _at(setting, engine))
        elif not known.isdigit() and layers < 999:
            yield Finding(
                "warning", "llamacpp-gpu-layers",
                f"-ngl {layers}: layers past the {layers}th stay on the CPU; set {_LAYERS_VARIABLE} in the "
                "env file to the GGUF's block count to check it, or give -ngl 999", _at(setting, engine))


def endpoints(deployment: Deployment) -> Iterator[Finding]:
    """llamacpp-server: what the gateway needs of the server: images, the chat template, /metrics."""
    for engine in deployment.llamacpp_engines:
        settings = _settings(engine)
        where = engine.command_location or engine.location
        if "--mmproj" not in settings:
            yield Finding(
                "error", "llamacpp-server",
                "no --mmproj: without the model's vision projector llama-server refuses every image", where)
        jinja = settings.get("--jinja")
        if jinja is not None and not jinja.on:
            yield Finding(
                "error", "llamacpp-server",
                "--no-jinja: without the model's Jinja chat template, thinking cannot be switched per "
                "request (chat_template_kwargs enable_thinking)", _at(jinja, engine))
        metrics = settings.get("--metrics")
        if metrics is None or not metrics.on:
            yield Finding(
                "error", "llamacpp-server",
                "no --metrics: llama-server's /metrics is off, so the gateway's windowed cache and "
                "throughput figures, /stats and the console read nothing from the engine",
                _at(metrics, engine))
