"""What each prefix strategy saves on an engine: prefill tokens per keyframe and the rate that follows.

On the Spark (a hybrid model, a 2,960-token block) the seed's 1,076-token request shares 419 tokens (the
416-token system turn and the user header) and shares no whole block, so every keyframe computes its
whole prompt. The strategies (docs/prefix-strategy.md):

- none: every prompt token computed;
- block filling: the shared prefix filled with policy text to a whole block; that block is cached, the
  request computes its own tokens only, but every prompt is a block longer (KV memory, the engine's
  max_model_len);
- match unit U (``--prefix-match-unit U`` and the gateway's priming): ``floor(419 / U)·U`` cached;
  vLLM refuses a unit that does not divide the block.

The rate is the step model's closed loop over a request that computes only its uncached tokens (the cost
model charges prefill by computed tokens and the weights each step reads); one priming request per engine
start is not counted (a few hundred tokens against thousands of keyframes).
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy.simulator.presets import SimPreset
from deploy.simulator.virtual import SEED_SHAPE, RequestShape, closed_loop

USER_HEADER_TOKENS = 3  # "<|im_start|>user\n" after the system turn: shared by every request too


@dataclass(frozen=True, slots=True)
class StrategyPrice:
    """One strategy on one engine: what a keyframe takes from the cache and computes, and the rate."""

    strategy: str
    valid: bool
    note: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    keyframes_per_min: float | None = None

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens a keyframe computes (prefill)."""
        return self.prompt_tokens - self.cached_tokens


def price_prefix_strategies(
    preset: SimPreset,
    callers: int,
    *,
    units: tuple[int, ...] = (16, 64),
    shape: RequestShape = SEED_SHAPE,
    requests: int = 160,
) -> list[StrategyPrice]:
    """Each strategy on an engine with ``preset``'s block, the seed's request shape, ``callers`` in flight."""
    block = preset.block_size
    shared = shape.shared_prefix_tokens + USER_HEADER_TOKENS
    n = shape.prompt_tokens
    own = n - shared
    filled = -(-shared // block) * block
    rows = [
        ("none", True, "the plain prompt: " + (
            f"the {shared:,}-token shared prefix is under one {block:,}-token block, nothing hits"
            if shared < block else f"{shared // block * block:,} tokens of whole blocks hit"),
         n, min(shared, n - 1) // block * block),
        ("block-fill", True, f"the shared prefix filled to {filled:,} tokens: every prompt is "
         f"{filled + own:,} tokens", filled + own, filled),
    ]
    for unit in units:
        if block % unit:
            rows.append((f"match-unit {unit}", False,
                         f"vLLM refuses it: the block {block:,} is not a multiple of {unit}", n, 0))
        else:
            rows.append((f"match-unit {unit}", True, f"primed: floor({shared} / {unit})·{unit} tokens hit",
                         n, shared // unit * unit))
    prices = []
    for name, valid, note, prompt, cached in rows:
        rate = None
        if valid:
            computed = RequestShape(prompt_tokens=prompt - cached, output_tokens=shape.output_tokens,
                                    output_jitter=shape.output_jitter)
            plain = preset.scaled(mamba_cache_mode="none", prefix_match_unit=None)
            rate = closed_loop(plain, callers, shape=computed, requests=requests).requests_per_min
        prices.append(StrategyPrice(name, valid, note, prompt, cached, rate))
    return prices
