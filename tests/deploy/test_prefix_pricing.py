"""`deploy predict` prices the prefix strategies on the Spark: prefill tokens per keyframe and the rate."""

from __future__ import annotations

from deploy.prefix_pricing import price_prefix_strategies
from deploy.simulator.presets import PRESETS


def test_the_sparks_strategies_are_priced_by_the_tokens_each_keyframe_computes() -> None:
    prices = {price.strategy: price for price in price_prefix_strategies(PRESETS["spark"], 8, requests=40)}
    assert prices["none"].computed_tokens == 1076
    assert prices["match-unit 16"].cached_tokens == 416  # 419 shared tokens, in whole 16-token units
    assert prices["block-fill"].cached_tokens == 2960
    assert prices["block-fill"].computed_tokens == 1076 - 419
    assert not prices["match-unit 64"].valid  # 2,960 is not a multiple of 64: vLLM refuses it
    assert prices["match-unit 64"].keyframes_per_min is None
    rates = [prices[name].keyframes_per_min for name in ("none", "match-unit 16")]
    assert rates[0] is not None
    assert rates[1] is not None
    assert rates[1] > rates[0]  # fewer prefill tokens per keyframe, more keyframes a minute


def test_a_block_the_unit_divides_accepts_it() -> None:
    prices = price_prefix_strategies(PRESETS["hybrid-cpu"], 2, requests=20)
    assert [p.valid for p in prices if p.strategy.startswith("match-unit")] == [True, True]  # 2,176 = 34 x 64
