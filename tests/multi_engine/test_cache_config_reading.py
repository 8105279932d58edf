"""The engine's cache configuration is read in one place, its wire (``read_cache_config``), for every user:
the start-up check, the first-request probe, the prefix keeper and planner, ``/stats`` and the cache probe."""

from __future__ import annotations

from gateway.engine.first_request import serves_linear_attention
from gateway.engine.wires import read_cache_config
from shaping.prefix_strategy import EngineCacheConfig

HYBRID = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="2176",enable_prefix_caching="True",engine="0",'
    'enable_mamba_shared_prefix_checkpoint="False",mamba_cache_mode="align",prefix_match_unit="16"} 1.0\n'
)
OLD_NAME_CACHING_OFF = (
    "# TYPE vllm:cache_config gauge\n"
    'vllm:cache_config{block_size="16",enable_prefix_caching="False"} 1.0\n'
)
LLAMACPP = "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 120\n"


def test_vllms_labels_are_read_by_its_wire() -> None:
    assert read_cache_config(HYBRID) == EngineCacheConfig(
        block_size=2176, prefix_match_unit=16, mamba_cache_mode="align", enable_prefix_caching=True
    )


def test_an_older_vllms_metric_name_is_read_too() -> None:
    config = read_cache_config(OLD_NAME_CACHING_OFF)
    assert config is not None
    assert (config.block_size, config.enable_prefix_caching, config.mamba_cache_mode) == (16, False, None)


def test_an_engine_without_a_cache_configuration_and_unreadable_text_say_nothing() -> None:
    assert read_cache_config(LLAMACPP) is None
    assert read_cache_config("not { prometheus") is None


def test_a_label_the_engine_does_not_write_stays_unsaid() -> None:
    assert serves_linear_attention(OLD_NAME_CACHING_OFF) is None  # no mamba_cache_mode: not said
    assert serves_linear_attention(HYBRID) is True
