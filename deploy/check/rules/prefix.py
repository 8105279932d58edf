"""prefix-match-unit: vLLM's ``--prefix-match-unit``, what it accepts, what defeats it, where it is needed.

A hybrid model (linear-attention layers beside full attention) gets an attention block sized to hold the
linear layers' state (about 2,960 tokens on the Spark), so the ~420-token shared prompt is never a whole
block and never hits. ``--prefix-match-unit U`` lets hits land on multiples of ``U`` inside a block, and
the gateway's priming request (docs/prefix-strategy.md) makes the engine keep the state there. vLLM
(v1/core/kv_cache_utils.py, ``resolve_kv_cache_block_sizes``) accepts a unit only when every
prefix-cacheable KV cache group's block size is divisible by it, refuses any unit but the block on a model
with a single group (a plain transformer), and ignores it without prefix caching or when a Mamba group is
outside ``--mamba-cache-mode align``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from deploy.check.compose import Deployment
from deploy.check.model import Finding, Location, Service

RULE = "prefix-match-unit"
HYBRID_BLOCK_ALIGNMENT = 16
"""What vLLM rounds a hybrid model's attention block to on the GPU (the attention kernels' alignment): the
only unit sure to divide a block computed at start (the Spark's 2,960 is a multiple of 16, not of 32)."""

# Model families whose checkpoints are hybrid (Gated DeltaNet or Mamba layers beside attention).
_HYBRID_MODELS = re.compile(
    r"qwen3[.-]?(5|6|next)|qwen3next|nemotron-?h|mamba|jamba|zamba|falcon-?h|granite-4\.0-h|bamba|"
    r"kimi-linear|minimax", re.IGNORECASE,
)


def _model(engine: Service) -> str:
    flag = engine.last_flag("--model")
    if flag is not None and flag.value:
        return flag.value
    return next((arg.value for arg in engine.command if not arg.value.startswith("-")), "")


def _hybrid(engine: Service) -> bool:
    return bool(_HYBRID_MODELS.search(_model(engine))) or any(
        flag.key.startswith("--mamba-") for flag in engine.flags
    )


def prefix_match_unit(deployment: Deployment) -> Iterator[Finding]:
    """prefix-match-unit: a unit vLLM refuses or ignores (error); a hybrid model without one (warning)."""
    for engine in deployment.engines:
        flag = engine.last_flag("--prefix-match-unit")
        at: Location = (flag.value_arg or flag.arg).location if flag is not None else (
            engine.command_location or engine.location
        )
        if flag is None:
            if _hybrid(engine):
                yield Finding(
                    "warning", RULE,
                    f"{_model(engine) or 'the model'} is hybrid: its attention block (about 2,960 tokens on "
                    "the Spark) is longer than the shared system prompt, so no request hits the prefix "
                    f"cache; add --prefix-match-unit {HYBRID_BLOCK_ALIGNMENT} (the gateway then primes it, "
                    "MODGATE_SHAPING__PREFIX_STRATEGY=auto)",
                    at,
                )
            continue
        try:
            unit = int(flag.value or "")
        except ValueError:
            unit = 0
        if unit <= 0:
            yield Finding("error", RULE, f"--prefix-match-unit {flag.value!r} must be a positive integer", at)
            continue
        block_flag = engine.last_flag("--block-size")
        written = "" if block_flag is None else block_flag.value or ""
        block = int(written) if written.isdigit() else None
        if block is not None and block % unit:
            yield Finding(
                "error", RULE,
                f"--prefix-match-unit {unit} does not divide --block-size {block}: vLLM refuses it at start "
                "(prefix-cacheable KV cache group block sizes must be divisible by prefix_match_unit)",
                at,
            )
        elif block is None and HYBRID_BLOCK_ALIGNMENT % unit:
            yield Finding(
                "error", RULE,
                f"--prefix-match-unit {unit}: vLLM computes a hybrid model's block at start and guarantees "
                f"only a multiple of {HYBRID_BLOCK_ALIGNMENT} (the Spark's: 2,960), and refuses a unit that "
                f"does not divide it; use {HYBRID_BLOCK_ALIGNMENT} or a divisor of it, or set --block-size",
                at,
            )
        prefix = engine.last_flag("--enable-prefix-caching")
        if prefix is not None and prefix.negated:
            yield Finding(
                "error", RULE,
                f"--prefix-match-unit {unit} with --no-enable-prefix-caching: nothing is cached, the unit is "
                "ignored",
                at,
            )
        mode = engine.last_flag("--mamba-cache-mode")
        if mode is not None and mode.value not in (None, "align"):
            yield Finding(
                "error", RULE,
                f"--prefix-match-unit {unit} with --mamba-cache-mode {mode.value}: vLLM lands hits inside a "
                "block only in 'align' mode and otherwise silently falls back to whole blocks",
                at,
            )
        if not _hybrid(engine):
            yield Finding(
                "warning", RULE,
                f"--prefix-match-unit {unit} on {_model(engine) or 'a model'} that does not look hybrid: "
                "on a model with one KV cache group vLLM refuses any unit but its block size",
                at,
            )
