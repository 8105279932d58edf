"""Which way an engine's prefix cache is made to hit the shared prefix, from the engine's own cache config.

Three engines, three laws (docs/prefix-strategy.md):

- vLLM started with ``--prefix-match-unit U`` (a hybrid model in "align" mode): hits land on multiples of
  ``U``, but a linear-attention state is kept only at block boundaries and at the end of a prompt (its last
  ``U`` boundary before the last token). So one *priming* request whose prompt ends right after the shared
  prefix keeps a state there, and every later request takes ``floor(shared / U)·U`` tokens from the cache.
  A restart, a model swap or an eviction loses it: the gateway primes again when cached tokens fall.
- vLLM without it: whole blocks only. A block no longer than the shared prefix already hits; a larger one
  hits only if the shared prefix is filled with policy text to a whole block (:class:`shaping.prefix.
  BlockFill`), which pays when the block fits a prompt budget. Otherwise the engine cannot cache the
  prefix, and the fix is the engine's flag.
- llama.cpp: token-level reuse of a slot's prompt and context checkpoints: nothing to do.

Pure: the caller reads the engine (its wire's token reuse, ``vllm:cache_config_info``, the shared prefix's
tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

PrefixStrategySetting = Literal["auto", "match-unit", "block-fill", "off"]
PrefixAction = Literal["prime", "engine-checkpoint", "fill", "none", "uncacheable"]

RECOMMENDED_MATCH_UNIT = 16
"""The unit to start vLLM with: the finest the tiny and the production hybrid blocks both divide (2176, 2944,
2960 are multiples of 16, not all of 64), and at most 15 shared tokens computed again per request."""

MATCH_UNIT_FIX = f"start vLLM with --prefix-match-unit {RECOMMENDED_MATCH_UNIT}"


def _label_int(value: str | None) -> int | None:
    if value is None or value in ("", "None"):
        return None
    try:
        return int(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class EngineCacheConfig:
    """What ``vllm:cache_config_info`` says about the prefix cache (its labels; absent ones as None)."""

    block_size: int | None = None
    prefix_match_unit: int | None = None
    mamba_cache_mode: str | None = "none"  # "align": a hybrid model whose linear-attention states are cached
    shared_prefix_checkpoint: bool = False  # --enable-mamba-shared-prefix-checkpoint
    enable_prefix_caching: bool | None = True

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> EngineCacheConfig:
        """Read from the metric's labels, as vLLM writes them (``"None"`` for unset); a label the engine
        does not write is None where its absence matters (the mamba mode, prefix caching on or off)."""
        caching = labels.get("enable_prefix_caching")
        return cls(
            block_size=_label_int(labels.get("block_size")),
            prefix_match_unit=_label_int(labels.get("prefix_match_unit")),
            mamba_cache_mode=labels.get("mamba_cache_mode"),
            shared_prefix_checkpoint=labels.get("enable_mamba_shared_prefix_checkpoint") == "True",
            enable_prefix_caching=None if caching is None else caching.lower() == "true",
        )

    @property
    def hybrid(self) -> bool:
        """A hybrid model whose linear-attention state is cached in vLLM's "align" mode."""
        return self.mamba_cache_mode == "align"

    @property
    def match_unit(self) -> int | None:
        """The match unit, when it is finer than the block (else hits land on blocks as without it)."""
        unit, block = self.prefix_match_unit, self.block_size
        if unit is None or (block is not None and unit >= block):
            return None
        return unit


@dataclass(frozen=True, slots=True)
class PrefixDecision:
    """What the gateway does for one engine's prefix cache, and why (said in the log and ``/readyz``)."""

    action: PrefixAction
    reason: str
    fix: str | None = None  # the engine flag that would make the prefix cacheable
    expected_cached_tokens: int = 0  # shared-prefix tokens each request should take from the cache

    @property
    def primes(self) -> bool:
        """Whether the gateway keeps a state at the shared prefix by priming (at start or as a fallback)."""
        return self.action in ("prime", "engine-checkpoint")


def primed_cached_tokens(shared_prefix_tokens: int, unit: int) -> int:
    """Tokens a request takes from the cache once a state is kept at the shared prefix's last unit."""
    return shared_prefix_tokens // unit * unit


def priming_prompt(shared_prefix_ids: Sequence[int]) -> list[int]:
    """The primer's token ids: the shared prefix and one more token.

    The engine keeps the state at the prompt's last unit boundary before its last token, so one token past
    the shared prefix puts it at ``floor(shared / unit)·unit``, the furthest any request can hit.
    """
    if not shared_prefix_ids:
        raise ValueError("an empty shared prefix cannot be primed")
    return [*shared_prefix_ids, shared_prefix_ids[-1]]


def choose_prefix_strategy(
    setting: PrefixStrategySetting,
    prefix_reuse: str | None,
    config: EngineCacheConfig | None,
    shared_prefix_tokens: int,
    fill_max_tokens: int,
) -> PrefixDecision:
    """The strategy for one engine: why it needs no block planning where it reuses its prompt token by
    token (its wire's ``prefix_reuse``; None: it caches whole KV blocks), its cache config (None: it shows
    none), the shared prefix in its tokens and the most tokens block filling may grow the prefix to."""
    if setting == "off":
        return PrefixDecision("none", "MODGATE_SHAPING__PREFIX_STRATEGY=off: the plain system prompt")
    if prefix_reuse is not None:
        return PrefixDecision("none", prefix_reuse, expected_cached_tokens=shared_prefix_tokens)
    if config is None or config.block_size is None:
        return PrefixDecision(
            "none", "the engine shows no vllm:cache_config_info: its block is unknown, nothing is changed"
        )
    if config.enable_prefix_caching is False:
        return PrefixDecision("uncacheable", "the engine runs with prefix caching off",
                              fix="start vLLM without --no-enable-prefix-caching")
    block, unit = config.block_size, config.match_unit
    if unit is not None and setting in ("auto", "match-unit"):
        expected = primed_cached_tokens(shared_prefix_tokens, unit)
        if config.shared_prefix_checkpoint:
            return PrefixDecision(
                "engine-checkpoint",
                f"match unit {unit} with --enable-mamba-shared-prefix-checkpoint: the engine keeps the state "
                "at the shared prefix itself (it needs EAGLE on the linear-attention group); the gateway "
                "primes only if cached tokens fall short",
                expected_cached_tokens=expected,
            )
        return PrefixDecision(
            "prime",
            f"match unit {unit} (block {block:,}): a priming request keeps the linear-attention state at the "
            f"{shared_prefix_tokens:,}-token shared prefix, so each request takes {expected:,} from the "
            "cache",
            expected_cached_tokens=expected,
        )
    # a plain model's block is free to choose: the same 16 as the hybrid's unit (vLLM takes no unit there)
    fix = MATCH_UNIT_FIX if config.hybrid else f"start vLLM with --block-size {RECOMMENDED_MATCH_UNIT}"
    if setting == "match-unit":
        return PrefixDecision(
            "uncacheable", "MODGATE_SHAPING__PREFIX_STRATEGY=match-unit, but the engine has no match unit "
            "finer than its block", fix=fix if config.hybrid else MATCH_UNIT_FIX,
        )
    if block <= shared_prefix_tokens and setting == "auto":
        whole = shared_prefix_tokens // block * block
        return PrefixDecision(
            "none", f"block {block:,} within the {shared_prefix_tokens:,}-token shared prefix: {whole:,} "
            "tokens hit as they are", expected_cached_tokens=whole,
        )
    filled = -(-shared_prefix_tokens // block) * block
    if setting == "block-fill" or filled <= fill_max_tokens:  # by name: no budget
        return PrefixDecision(
            "fill",
            f"block {block:,}: the shared prefix is filled with policy text to {filled:,} tokens, a whole "
            "block",
            expected_cached_tokens=filled,
        )
    return PrefixDecision(
        "uncacheable",
        f"this engine cannot cache the {shared_prefix_tokens:,}-token shared prefix: its block is "
        f"{block:,} tokens and filling to it exceeds MODGATE_SHAPING__PREFIX_FILL_MAX_TOKENS="
        f"{fill_max_tokens:,}",
        fix=fix,
    )
