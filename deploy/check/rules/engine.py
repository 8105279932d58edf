"""Rules on an engine's own flags that decide whether it starts and reports what the gateway relies on."""

from __future__ import annotations

import math
from collections.abc import Iterator

from deploy.check.compose import Deployment
from deploy.check.model import Finding, Location, Severity, where

_ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
_ATTENTION_KERNEL_ALIGNMENT = 16  # FlashAttention/FlashInfer block sizes are multiples of 16
_CONV_KERNEL_ALIGNMENT = 8  # vLLM: mamba_block_size "must be a multiple of 8 to align with causal_conv1d"


def memory_fraction(deployment: Deployment) -> Iterator[Finding]:
    """memory-fraction-mismatch: --gpu-memory-utilization against PYTORCH_ALLOC_CONF's fraction."""
    for engine in deployment.engines:
        flag = engine.last_flag("--gpu-memory-utilization")
        conf = next(
            (engine.environment[name] for name in _ALLOC_CONF_VARS if name in engine.environment), None
        )
        fraction = _alloc_conf_fraction(conf.value) if conf is not None and conf.value else None
        if flag is None and fraction is None:
            continue
        if flag is None or fraction is None or conf is None:
            present = (
                "--gpu-memory-utilization"
                if flag is not None
                else "PYTORCH_ALLOC_CONF per_process_memory_fraction"
            )
            at = flag.arg.location if flag is not None else (conf.location if conf else engine.location)
            yield Finding(
                "warning",
                "memory-fraction-mismatch",
                f"{present} is set without its twin: set --gpu-memory-utilization and "
                "PYTORCH_ALLOC_CONF=per_process_memory_fraction:X from one variable",
                at,
            )
            continue
        flag_at = flag.value_arg.location if flag.value_arg else flag.arg.location
        related = (
            conf.location,
            *deployment.env_lines((flag.value_arg.variables if flag.value_arg else ()) + conf.variables),
        )
        try:
            utilization = float(flag.value or "")
            per_process = float(fraction)
        except ValueError:
            yield Finding(
                "error",
                "memory-fraction-mismatch",
                f"cannot compare --gpu-memory-utilization {flag.value!r} with per_process_memory_fraction "
                f"{fraction!r}: both must be numbers",
                flag_at,
                related,
            )
            continue
        if not math.isclose(utilization, per_process, rel_tol=0.0, abs_tol=1e-9):
            yield Finding(
                "error",
                "memory-fraction-mismatch",
                f"--gpu-memory-utilization {flag.value} differs from PYTORCH_ALLOC_CONF "
                f"per_process_memory_fraction {fraction} (at {where(conf.location, flag_at)}): the engine "
                "OOMs at start; feed both from one .env variable",
                flag_at,
                related,
            )


def _alloc_conf_fraction(conf: str) -> str | None:
    """`per_process_memory_fraction` from a PYTORCH_ALLOC_CONF like `a:1,per_process_memory_fraction:0.8`."""
    for part in conf.split(","):
        key, _colon, value = part.partition(":")
        if key.strip() == "per_process_memory_fraction":
            return value.strip()
    return None


def prompt_tokens_details(deployment: Deployment) -> Iterator[Finding]:
    """prompt-tokens-details: without it, cached_tokens comes back null and reads as 0."""
    for engine in deployment.engines:
        flag = engine.last_flag("--enable-prompt-tokens-details")
        if flag is not None and not flag.negated:
            continue
        yield Finding(
            "error",
            "prompt-tokens-details",
            "--enable-prompt-tokens-details is missing: usage.prompt_tokens_details.cached_tokens, the "
            "per-request truth about prefix-cache hits, comes back null and reads as 0",
            flag.arg.location if flag is not None else (engine.command_location or engine.location),
        )


def mamba_block_size(deployment: Deployment) -> Iterator[Finding]:
    """mamba-block-size: a value vLLM refuses (error) or will not use as written (warnings)."""
    for engine in deployment.engines:
        flag = engine.last_flag("--mamba-block-size")
        if flag is None:
            continue
        at = flag.value_arg.location if flag.value_arg else flag.arg.location
        try:
            size = int(flag.value or "")
        except ValueError:
            size = 0
        if size <= 0 or size % _CONV_KERNEL_ALIGNMENT:
            yield _mamba(
                "error",
                f"--mamba-block-size {flag.value!r} must be a positive multiple of {_CONV_KERNEL_ALIGNMENT} "
                "(vLLM aligns Mamba blocks to its causal_conv1d kernel)",
                at,
            )
            continue
        prefix = engine.last_flag("--enable-prefix-caching")
        if prefix is None or prefix.negated:
            yield _mamba(
                "warning",
                f"--mamba-block-size {size} without --enable-prefix-caching has no effect: vLLM keeps one "
                "Mamba block per sequence",
                at,
            )
            continue
        mode = engine.last_flag("--mamba-cache-mode")
        if mode is not None and mode.value == "align":
            yield _mamba(
                "warning",
                f"--mamba-block-size {size} is ignored with --mamba-cache-mode align: vLLM sets the Mamba "
                "block to the attention block size",
                at,
            )
        elif size % _ATTENTION_KERNEL_ALIGNMENT:
            aligned = math.lcm(size, _ATTENTION_KERNEL_ALIGNMENT)
            yield _mamba(
                "warning",
                f"--mamba-block-size {size} is not a multiple of {_ATTENTION_KERNEL_ALIGNMENT}: vLLM "
                f"re-aligns it to a multiple of lcm({size}, kernel alignment) = {aligned} or more, rounded "
                "up to hold a whole Mamba state, so the block used is not the one written (in 'align' "
                "mode, the default for models without full Mamba prefix caching, the attention block size "
                "replaces it)",
                at,
            )


def _mamba(severity: Severity, message: str, at: Location) -> Finding:
    return Finding(severity, "mamba-block-size", message, at)
