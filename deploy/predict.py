"""`modgate deploy predict`: what the simulator's cost model expects of an engine configuration.

Before a 12-minute restart window: the engine's flags, read from the compose file by `deploy check`'s own
parser, become simulator options where the simulator has a mechanism for them; the seed's request shape
then runs in a closed loop at the gateway's in-flight cap on the step model's virtual clock (a fraction
of a second) and again with the tuned baseline (the Spark preset, fitted to the seed's final
configuration). Every other flag is listed as ignored, so a prediction never hides what it left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.check import DEFAULT_MAX_INFLIGHT, ServiceFlags, UnreadableInputError, read_services
from deploy.check.llamacpp import server_settings, slots
from deploy.check.model import gateway_setting
from deploy.prefix_pricing import StrategyPrice, price_prefix_strategies
from deploy.simulator.llamacpp_law import LlamaCppOptions, LlamaCppScheduler
from deploy.simulator.presets import GB10_GGUF_125B, PRESETS, SimPreset, WeightReads
from deploy.simulator.virtual import SEED_SHAPE, THINKING_OFF_SHAPE, LoadFigures, RequestShape, closed_loop

TOLERANCE = 0.02  # figures within 2 % of each other count as equal when ranking


class FlagValueError(UnreadableInputError):
    """A modelled flag whose value cannot be read (not a number, not JSON)."""


def _int(flag: str, value: str | None, minimum: int = 1) -> int:
    try:
        number = int(value or "")
    except ValueError as exc:
        raise FlagValueError(f"{flag} {value!r}: not an integer") from exc
    if number < minimum:
        raise FlagValueError(f"{flag} {value!r}: must be at least {minimum}")
    return number


def _share(flag: str, value: str | None) -> float:
    try:
        number = float(value or "")
    except ValueError as exc:
        raise FlagValueError(f"{flag} {value!r}: not a number") from exc
    if not 0 < number < 1:
        raise FlagValueError(f"{flag} {value!r}: a share between 0 and 1 (exclusive)")
    return number


def _speculative(flag: str, value: str | None) -> dict[str, Any]:
    try:
        config = json.loads(value or "")
    except json.JSONDecodeError as exc:
        raise FlagValueError(f"{flag} {value!r}: not JSON") from exc
    if not isinstance(config, dict):
        raise FlagValueError(f"{flag} {value!r}: not a JSON object")
    drafts = _int(f"{flag} num_speculative_tokens", str(config.get("num_speculative_tokens", 1)), minimum=0)
    return {"num_speculative_tokens": drafts}


# Flag → (simulator options from its value, what the simulator does with it).
_MODELLED: dict[str, tuple[Callable[[str, str | None, bool], dict[str, Any]], str]] = {
    "--max-num-seqs": (lambda f, v, _n: {"max_num_seqs": _int(f, v)}, "batch slots"),
    "--max-num-batched-tokens": (lambda f, v, _n: {"max_num_batched_tokens": _int(f, v)},
                                 "token budget per step"),
    "--speculative-config": (lambda f, v, _n: _speculative(f, v),
                             "verify steps: 1 + drafts tokens per sequence, drafts accepted at the "
                             "Spark's measured 39.9 %"),
    "--num-speculative-tokens": (lambda f, v, _n: {"num_speculative_tokens": _int(f, v, minimum=0)},
                                 "drafts per verify step"),
    "--long-prefill-token-threshold": (
        lambda f, v, _n: {"long_prefill_token_threshold": _int(f, v, minimum=0)},
        "prefill tokens per sequence per step"),
    "--enable-chunked-prefill": (lambda _f, _v, negated: {"enable_chunked_prefill": not negated},
                                 "a prompt computed in chunks or whole"),
    "--max-num-prefill-tokens-per-step": (
        lambda f, v, _n: {"max_num_prefill_tokens_per_step": _int(f, v)}, "prefill tokens per step"),
    "--max-parallel-prefills": (lambda f, v, _n: {"max_parallel_prefills": _int(f, v)},
                                "sequences prefilling per step"),
    "--prefill-compute-share": (lambda f, v, _n: {"prefill_compute_share": _share(f, v)},
                                "prefill's share of a step's time while sequences decode"),
}
# Prefill-scheduling knobs with no mechanism in the simulator: the prediction may be optimistic.
_UNMODELLED_KNOBS = frozenset({
    "--prefill-compute-half-life",  # the share is enforced within each step, as if the half-life were 0
    "--prefill-policy",
    "--decode-refill-target",
    "--max-num-partial-prefills",
    "--max-long-partial-prefills",
    "--speculative-model",
})
_PREFILL_SCHEDULING = frozenset({
    "--long-prefill-token-threshold", "--max-num-prefill-tokens-per-step", "--max-parallel-prefills",
    "--prefill-compute-share",
})
PREFILL_CAVEAT = (
    "each prefill step reads the weights its chunk routes to, so cutting prefills costs rate (the 256 cap "
    "at 7 in flight: 26.0/min predicted, 24.3 measured on the Spark); the TTFT under "
    "--prefill-compute-share rests on our reading of the fork's flag (docs/engineering.md)"
)
_VALUELESS = frozenset({"--enable-chunked-prefill"})
_NO_COST = "no cost in the simulator's model"


@dataclass(frozen=True)
class FlagReading:
    """How one flag of the engine's command entered the prediction."""

    flag: str
    value: str | None
    modelled: bool
    note: str


@dataclass(frozen=True)
class Prediction:
    """The simulator's figures for one engine service beside the tuned baseline's."""

    service: str
    callers: int
    options: dict[str, Any]
    predicted: LoadFigures
    baseline: LoadFigures
    flags: list[FlagReading] = field(default_factory=list)
    engine_kind: str = "vllm"
    # llama.cpp: thinking off beside the baseline's, the prompt tokens its cache reused, what it assumes.
    thinking_off: tuple[LoadFigures, LoadFigures] | None = None
    reused_tokens: dict[str, float] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    prefix_strategies: list[StrategyPrice] = field(default_factory=list)  # vLLM: each strategy's price

    @property
    def verdict(self) -> str:
        """``better``, ``worse`` or ``same`` as the baseline: rate first, then TTFT, then end to end."""
        for mine, theirs, higher_is_better in (
            (self.predicted.requests_per_min, self.baseline.requests_per_min, True),
            (self.predicted.ttft_mean_s, self.baseline.ttft_mean_s, False),
            (self.predicted.e2e_mean_s, self.baseline.e2e_mean_s, False),
        ):
            if abs(mine - theirs) <= TOLERANCE * theirs:
                continue
            return "better" if (mine > theirs) == higher_is_better else "worse"
        return "same"


def engine_options(service: ServiceFlags) -> tuple[dict[str, Any], list[FlagReading]]:
    """Simulator options from the engine's flags (the last of a repeated flag wins, as in vLLM)."""
    options: dict[str, Any] = {}
    readings: list[FlagReading] = []
    winners = {flag.key: flag for flag in service.flags}
    for flag in winners.values():
        shown = flag.name if flag.value is None else f"{flag.name} {flag.value}"
        if flag.key in _MODELLED:
            read, what = _MODELLED[flag.key]
            value = None if flag.key in _VALUELESS else flag.value
            options.update(read(flag.name, value, flag.negated))
            readings.append(FlagReading(shown, flag.value, True, what))
        elif flag.key in _UNMODELLED_KNOBS:
            readings.append(FlagReading(shown, flag.value, False,
                                        "prefill/speculation knob without a mechanism in the simulator: "
                                        "the prediction may be optimistic"))
        else:
            readings.append(FlagReading(shown, flag.value, False, _NO_COST))
    return options, readings


def options_from_flags(flags: Mapping[str, str | None]) -> dict[str, Any]:
    """Simulator options from vLLM-style flags given by name (``modgate engine-sim``'s own options)."""
    options: dict[str, Any] = {}
    for name, value in flags.items():
        key = "--" + name.removeprefix("--").replace("_", "-").removeprefix("no-")
        if key not in _MODELLED:
            raise FlagValueError(f"{name}: the simulator has no option for it")
        options.update(_MODELLED[key][0](name, value, name.removeprefix("--").startswith("no-")))
    return options


def in_flight_cap(services: Sequence[ServiceFlags]) -> int:
    """The gateway's MODGATE_ENGINE__MAX_INFLIGHT where the compose file sets it, else its default."""
    for service in services:
        if not service.is_gateway:
            continue
        value = gateway_setting(service.environment, "MODGATE_ENGINE__MAX_INFLIGHT")
        if value:
            return _int("MODGATE_ENGINE__MAX_INFLIGHT", value)
    return DEFAULT_MAX_INFLIGHT


def predict(
    compose_files: Sequence[Path],
    *,
    env_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    baseline: SimPreset | None = None,
    requests: int = 160,
) -> list[Prediction]:
    """One prediction per engine service of the compose files."""
    services = read_services(compose_files, env_file=env_file, environ=environ)
    engines = [service for service in services if service.is_engine]
    if not engines:
        raise UnreadableInputError(
            "no engine service (an image or command naming vLLM or llama.cpp's server) in the compose files")
    tuned = baseline or PRESETS["spark"]
    callers = in_flight_cap(services)
    base_figures = closed_loop(tuned, callers, requests=requests)
    predictions = []
    for engine in engines:
        if engine.engine_kind == "llamacpp":
            predictions.append(_predict_llamacpp(engine, tuned, callers, requests, base_figures))
            continue
        options, readings = engine_options(engine)
        preset = tuned.scaled(**options)
        figures = base_figures if not options else closed_loop(preset, callers, requests=requests)
        predictions.append(Prediction(
            engine.name, callers, options, figures, base_figures, readings,
            prefix_strategies=price_prefix_strategies(preset, callers, requests=requests),
        ))
    return predictions


def prediction_as_json(prediction: Prediction) -> dict[str, Any]:
    """One engine's prediction as a JSON object."""

    def figures(load: LoadFigures) -> dict[str, float]:
        return {
            "keyframes_per_min": load.requests_per_min,
            "ttft_mean_s": load.ttft_mean_s,
            "e2e_mean_s": load.e2e_mean_s,
            "generation_tokens_per_s": load.generation_tokens_per_s,
            "forward_passes_per_request": load.passes_per_request,
        }

    return {
        "service": prediction.service,
        "in_flight": prediction.callers,
        "request_shape": {
            "prompt_tokens": SEED_SHAPE.prompt_tokens,
            "output_tokens": SEED_SHAPE.output_tokens,
        },
        "options": prediction.options,
        "predicted": figures(prediction.predicted),
        "baseline": figures(prediction.baseline),
        "verdict": prediction.verdict,
        "modelled": [reading.flag for reading in prediction.flags if reading.modelled],
        "ignored": [reading.flag for reading in prediction.flags
                    if not reading.modelled and reading.note == _NO_COST],
        "ignored_knobs": [reading.flag for reading in prediction.flags
                          if not reading.modelled and reading.note != _NO_COST],
        "engine": prediction.engine_kind,
        "prefix_strategies": [
            {"strategy": price.strategy, "valid": price.valid, "note": price.note,
             "prompt_tokens": price.prompt_tokens, "cached_tokens": price.cached_tokens,
             "computed_tokens": price.computed_tokens,
             "prefill_tokens_saved": SEED_SHAPE.prompt_tokens - price.computed_tokens if price.valid else 0,
             "keyframes_per_min": price.keyframes_per_min}
            for price in prediction.prefix_strategies
        ],
        **_llamacpp_json(prediction, figures),
        "caveats": [PREFILL_CAVEAT] if any(
            reading.modelled and reading.flag.split()[0].replace("_", "-") in _PREFILL_SCHEDULING
            for reading in prediction.flags
        ) else [],
    }


# --- llama.cpp's server ----------------------------------------------------------------------------------

# llama-server settings → (LlamaCppOptions field, how to read the value, what the law does with it).
_LLAMACPP_MODELLED: dict[str, tuple[str, Callable[[str, str | None], Any], str]] = {
    "--ctx-size": ("n_ctx", lambda f, v: _int(f, v, minimum=0), "the context, split among the slots"),
    "--batch-size": ("n_batch", _int, "tokens in one update_slots batch"),
    "--ubatch-size": ("n_ubatch", _int, "tokens in one forward pass"),
    "--cache-prompt": ("cache_prompt", lambda _f, v: v != "false", "a slot reuses its cached prefix"),
    "--ctx-checkpoints": ("n_ctx_checkpoints", lambda f, v: _int(f, v, minimum=0),
                          "checkpoints of the recurrent state, per slot"),
    "--checkpoint-min-step": ("checkpoint_min_step", lambda f, v: _int(f, v, minimum=0),
                              "spacing between checkpoints"),
    "--slot-prompt-similarity": ("slot_prompt_similarity", lambda f, v: _share(f, v) if v != "0" else 0.0,
                                 "slot choice by common prefix"),
    "--cache-ram": ("cache_ram_mib", lambda f, v: _int(f, v, minimum=-1), "the host-memory prompt cache"),
}
_LLAMACPP_SLOTS = frozenset({"--parallel", "--kv-unified"})
# Flags that cost something the law has no mechanism for: the prediction is optimistic where they are set.
_LLAMACPP_UNMODELLED = {
    "--gpu-layers": "layers left on the CPU are not modelled (999 or all: none)",
    "--model-draft": "speculative decoding (a draft model) is not modelled",
    "--draft-max": "speculative decoding is not modelled",
    "--spec-type": "speculative decoding is not modelled",
    "--cache-reuse": "KV shifting: llama-server turns it off for multimodal models",
}
LLAMACPP_ASSUMPTIONS = (
    "the per-step hardware cost the vLLM model uses (SimPreset.weight_reads): every forward pass (a "
    "micro-batch of -ub tokens) reads the weights its prompt tokens route to at {bandwidth:.0f} GB/s, here "
    "from the GGUF ({gguf_gb:.0f} GB, {gguf_path:.1f} GB a token's path, against the NVFP4's {nvfp4_gb:.0f} "
    "and {nvfp4_path:.1f}); decode at the fitted rate times the byte ratio ({decode:.0f} tokens/s against "
    "vLLM's {vllm_decode:.0f}); compute at the Spark's fitted {prefill:,.0f} prefill tokens/s plus "
    "{overhead:.3f} s a pass, as if llama.cpp's CUDA kernels on the GB10 matched the vLLM fork's: unmeasured",
    "no speculative decoding (the GGUF has no MTP head; MTP made vLLM slower)",
    "the model is hybrid (linear-attention layers): a slot reuses the shared prefix only from a context "
    "checkpoint at or before it; the server saves one before the last user message, so a keyframe reuses "
    "the system prompt (416 tokens) on a slot whose last request had it, never the user header or image",
    "an image is decoded on its own, before the batch, in micro-batches of -ub tokens; the vision encoder "
    "costs what the fitted prefill rate puts in it, as for vLLM",
)


@dataclass(frozen=True)
class LlamaCppPricing:
    """The tuned vLLM preset's rates on llama.cpp's weights, with the weight reads on each side."""

    preset: SimPreset  # GGUF's reads, the decode rate scaled by them
    gguf: WeightReads  # what a llama.cpp pass reads
    nvfp4: WeightReads  # what the tuned vLLM preset's pass reads


def llamacpp_preset(tuned: SimPreset) -> LlamaCppPricing:
    """The tuned vLLM preset's rates on llama.cpp's weights: the same per-step hardware cost
    (``WeightReads``) over the GGUF's bytes, and a decode rate scaled by the bytes each token reads
    (decode is memory-bound: the fitted rate already prices the NVFP4 path's reads)."""
    if tuned.weight_reads is None:
        raise ValueError(
            f"the baseline preset {tuned.name!r} has no weight reads: llama.cpp's passes are priced by the "
            "bytes they read against vLLM's (SimPreset.weight_reads)"
        )
    ratio = tuned.weight_reads.active_bytes_per_token / GB10_GGUF_125B.active_bytes_per_token
    preset = tuned.scaled(weight_reads=GB10_GGUF_125B, decode_tokens_per_s=tuned.decode_tokens_per_s * ratio)
    return LlamaCppPricing(preset, GB10_GGUF_125B, tuned.weight_reads)


def _llamacpp_options(engine: ServiceFlags) -> tuple[dict[str, Any], list[FlagReading]]:
    """LlamaCppOptions fields from llama-server's settings (its aliases and LLAMA_ARG_* variables)."""
    settings = server_settings(
        [(flag.key, flag.value, flag.negated, flag.location) for flag in engine.flags], engine.environment)
    count, unified = slots(settings)
    options: dict[str, Any] = {"n_parallel": count, "kv_unified": unified}
    readings: list[FlagReading] = []
    for key, setting in settings.items():
        shown = key if setting.value is None else f"{key} {setting.value}"
        if key in _LLAMACPP_MODELLED:
            name, read, what = _LLAMACPP_MODELLED[key]
            options[name] = read(key, setting.value)
            readings.append(FlagReading(shown, setting.value, True, what))
        elif key in _LLAMACPP_SLOTS:
            readings.append(FlagReading(shown, setting.value, True, "slots, each one sequence"))
        elif key in _LLAMACPP_UNMODELLED and not (key == "--gpu-layers" and setting.value in ("999", "all")):
            readings.append(FlagReading(shown, setting.value, False, _LLAMACPP_UNMODELLED[key]))
        else:
            readings.append(FlagReading(shown, setting.value, False, _NO_COST))
    return options, readings


def _llamacpp_run(
    preset: SimPreset, options: LlamaCppOptions, callers: int, requests: int, shape: RequestShape
) -> tuple[LoadFigures, float]:
    """The figures of one closed-loop run and the prompt tokens reused per request."""
    engines: list[LlamaCppScheduler] = []

    def law(chosen: SimPreset) -> LlamaCppScheduler:
        engines.append(LlamaCppScheduler(chosen, 1.0, options))
        return engines[-1]

    figures = closed_loop(preset, callers, shape=shape, requests=requests, law=law)
    counters = engines[0].counters
    started = max(1, counters.prefix_cache_queries // shape.prompt_tokens)
    return figures, counters.prefix_cache_hits / started


def _predict_llamacpp(
    engine: ServiceFlags, tuned: SimPreset, callers: int, requests: int, base_on: LoadFigures
) -> Prediction:
    fields, readings = _llamacpp_options(engine)
    options = LlamaCppOptions(**fields)
    pricing = llamacpp_preset(tuned)
    mine, gguf, nvfp4 = pricing.preset, pricing.gguf, pricing.nvfp4
    on, reused_on = _llamacpp_run(mine, options, callers, requests, SEED_SHAPE)
    off, reused_off = _llamacpp_run(mine, options, callers, requests, THINKING_OFF_SHAPE)
    base_off = closed_loop(tuned, callers, shape=THINKING_OFF_SHAPE, requests=requests)
    assumptions = [text.format(
        prefill=tuned.prefill_tokens_per_s, decode=mine.decode_tokens_per_s,
        vllm_decode=tuned.decode_tokens_per_s, overhead=tuned.step_overhead_s,
        bandwidth=gguf.bandwidth_bytes_per_s / 1e9,
        gguf_gb=gguf.total_weight_bytes / 1e9, gguf_path=gguf.active_bytes_per_token / 1e9,
        nvfp4_gb=nvfp4.total_weight_bytes / 1e9, nvfp4_path=nvfp4.active_bytes_per_token / 1e9,
    ) for text in LLAMACPP_ASSUMPTIONS]
    return Prediction(
        engine.name, callers, fields, on, base_on, readings, engine_kind="llamacpp",
        thinking_off=(off, base_off), reused_tokens={"on": reused_on, "off": reused_off},
        assumptions=assumptions,
    )


def _llamacpp_json(
    prediction: Prediction, figures: Callable[[LoadFigures], dict[str, float]]
) -> dict[str, Any]:
    if prediction.thinking_off is None:
        return {}
    predicted, baseline = prediction.thinking_off
    return {
        "thinking_off": {
            "request_shape": {"prompt_tokens": THINKING_OFF_SHAPE.prompt_tokens,
                              "output_tokens": THINKING_OFF_SHAPE.output_tokens},
            "predicted": figures(predicted),
            "baseline": figures(baseline),
        },
        "reused_prompt_tokens_per_request": prediction.reused_tokens,
        "assumptions": prediction.assumptions,
    }
