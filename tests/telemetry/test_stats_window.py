"""The recent window and the engine counters' window: percentiles, ageing, increases across restarts."""

from __future__ import annotations

import pytest

from gateway.telemetry.windows import (
    EngineCacheCounters,
    EngineCacheWindow,
    RecentRequests,
    RequestSample,
    percentile,
    percentiles,
    read_engine_cache_counters,
)
from tests.support import FakeClock


def sample(
    e2e_s: float = 1.0,
    *,
    prompt: int = 1000,
    cached: int = 0,
    thinking: str = "on",
    reused: str | None = None,
    ttft_s: float | None = 0.1,
) -> RequestSample:
    return RequestSample(
        request_id="modr-x-0",
        action="allow",
        thinking=thinking,
        reused=reused,
        end_to_end_s=e2e_s,
        queue_wait_s=0.0,
        shaping_s=0.01,
        ttft_s=ttft_s,
        decode_s=None if ttft_s is None else e2e_s - ttft_s,
        prompt_tokens=prompt,
        cached_tokens=cached,
        image_tokens=600,
        completion_tokens=90,
        reasoning_tokens=80,
    )


def test_percentiles_interpolate_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentiles([3.0]).p99 == 3.0
    assert percentiles([None, None]).count == 0


def test_samples_older_than_the_window_are_dropped() -> None:
    clock = FakeClock(50.0)
    recent = RecentRequests(window_s=60, clock=clock)
    for _ in range(10):
        recent.add(sample(9.0, cached=900))  # an old burst of slow, fully cached requests
    clock.now += 61
    recent.add(sample(1.0, cached=0))
    summary = recent.summary()
    assert summary.keyframes == 1
    assert summary.latencies["end_to_end"].p99 == 1.0
    assert summary.cached_share == 0.0


def test_keyframes_per_minute_counts_only_the_time_covered_so_far() -> None:
    clock = FakeClock(50.0)
    recent = RecentRequests(window_s=300, clock=clock)
    clock.now += 30
    for _ in range(20):
        recent.add(sample())
    assert recent.summary().keyframes_per_minute == pytest.approx(40.0)  # 20 in 30 s, not 20 in 300 s


def test_thinking_share_and_token_sums_leave_out_reused_verdicts() -> None:
    recent = RecentRequests(window_s=60, clock=FakeClock(50.0))
    recent.add(sample(thinking="on", cached=100))
    recent.add(sample(thinking="off"))
    recent.add(sample(thinking="off", reused="exact", ttft_s=None, prompt=0))
    summary = recent.summary()
    assert summary.thinking_share == 0.5
    assert summary.reused_share == pytest.approx(1 / 3)
    assert summary.prompt_tokens == 2000
    assert summary.cached_tokens == 100
    assert summary.latencies["ttft"].count == summary.latencies["queue_wait"].count == 2  # reused: no engine
    assert summary.latencies["end_to_end"].count == 3


def test_an_empty_window_has_no_rates_rather_than_zero_rates() -> None:
    summary = RecentRequests(window_s=60, clock=FakeClock(50.0)).summary()
    assert summary.cached_share is None
    assert summary.thinking_share is None
    assert summary.latencies["end_to_end"].p50 is None


def test_the_engine_rate_is_the_increase_between_scrapes_not_the_totals() -> None:
    clock = FakeClock(50.0)
    window = EngineCacheWindow(window_s=60, clock=clock)
    window.observe(EngineCacheCounters(queries=100_000, hits=90_000, block_size=16))  # healthy since start
    clock.now += 15
    window.observe(EngineCacheCounters(queries=110_000, hits=90_500, block_size=16))
    rate = window.window_rate()
    assert (rate.hits, rate.queries) == (500, 10_000)
    assert rate.ratio == pytest.approx(0.05)
    assert window.latest is not None
    assert window.latest.since_start_ratio == pytest.approx(0.8227, abs=1e-3)


def test_the_window_keeps_one_scrape_before_its_start_as_the_base() -> None:
    clock = FakeClock(50.0)
    window = EngineCacheWindow(window_s=60, clock=clock)
    window.observe(EngineCacheCounters(queries=0, hits=0, block_size=None))
    clock.now += 10
    window.observe(EngineCacheCounters(queries=1000, hits=1000, block_size=None))  # old burst
    clock.now += 100
    window.observe(EngineCacheCounters(queries=3000, hits=1000, block_size=None))
    rate = window.window_rate()
    assert (rate.hits, rate.queries, rate.scrapes) == (0, 2000, 2)
    assert rate.span_s == 100


def test_an_engine_restart_counts_from_zero_instead_of_a_negative_increase() -> None:
    clock = FakeClock(50.0)
    window = EngineCacheWindow(window_s=600, clock=clock)
    window.observe(EngineCacheCounters(queries=50_000, hits=40_000, block_size=None))
    clock.now += 15
    window.observe(EngineCacheCounters(queries=2_000, hits=100, block_size=None))  # restarted meanwhile
    rate = window.last_interval_rate()
    assert (rate.hits, rate.queries) == (100, 2_000)


def test_no_queries_gives_no_ratio() -> None:
    window = EngineCacheWindow(window_s=60, clock=FakeClock(50.0))
    window.observe(EngineCacheCounters(queries=10, hits=5, block_size=None))
    assert window.window_rate().ratio is None


VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 3000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 2048.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="2960",enable_prefix_caching="True",engine="0"} 1.0
"""


def test_engine_counters_are_summed_over_engines_and_the_block_size_is_read() -> None:
    counters = read_engine_cache_counters(VLLM_METRICS)
    assert (counters.queries, counters.hits, counters.block_size) == (4000, 2048, 2960)


def test_untyped_counters_and_a_missing_block_size_are_read_too() -> None:
    text = "vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 4\n"
    counters = read_engine_cache_counters(text)
    assert (counters.queries, counters.hits, counters.block_size) == (10, 4, None)


def test_an_engine_without_prefix_cache_counters_is_reported() -> None:
    with pytest.raises(ValueError, match="prefix_cache"):
        read_engine_cache_counters("vllm:num_requests_running 1\n")
