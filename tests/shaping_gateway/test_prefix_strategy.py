"""The prefix strategy: chosen per engine from its cache config, primed at start, primed again when lost."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.simulator import PRESETS, create_sim_app
from gateway.engine.wires import wire_for
from shaping.prefix_strategy import (
    EngineCacheConfig,
    PrefixStrategySetting,
    choose_prefix_strategy,
    priming_prompt,
)
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory

HYBRID = EngineCacheConfig(block_size=2176, prefix_match_unit=None, mamba_cache_mode="align")


# --- the choice, alone -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "kind", "config", "action", "expected"), [
    ("auto", "vllm", EngineCacheConfig(2176, 16, "align"), "prime", 416),
    ("match-unit", "vllm", EngineCacheConfig(2176, 16, "align"), "prime", 416),
    ("auto", "vllm", EngineCacheConfig(2176, 16, "align", shared_prefix_checkpoint=True),
     "engine-checkpoint", 416),
    ("auto", "vllm", HYBRID, "fill", 2176),
    ("block-fill", "vllm", EngineCacheConfig(2176, 16, "align"), "fill", 2176),
    ("auto", "vllm", EngineCacheConfig(128), "none", 384),
    ("block-fill", "vllm", EngineCacheConfig(128), "fill", 512),
    ("auto", "llamacpp", None, "none", 419),
    ("off", "vllm", EngineCacheConfig(2176, 16, "align"), "none", 0),
    ("auto", "vllm", None, "none", 0),
    ("auto", "vllm", EngineCacheConfig(2176, 2176, "align"), "fill", 2176),  # a unit of a block is no unit
])
def test_the_strategy_follows_the_engine_kind_and_cache_config(
    setting: PrefixStrategySetting, kind: str, config: EngineCacheConfig | None, action: str, expected: int
) -> None:
    decision = choose_prefix_strategy(setting, wire_for(kind).prefix_reuse, config, 419, 4096)
    assert (decision.action, decision.expected_cached_tokens) == (action, expected)


def test_a_block_beyond_the_budget_is_said_uncacheable_naming_the_flag() -> None:
    decision = choose_prefix_strategy("auto", None, EngineCacheConfig(2960, None, "align"), 419, 2048)
    assert decision.action == "uncacheable"
    assert decision.fix == "start vLLM with --prefix-match-unit 16"
    forced = choose_prefix_strategy("match-unit", None, HYBRID, 419, 4096)
    assert (forced.action, forced.fix) == ("uncacheable", "start vLLM with --prefix-match-unit 16")


def test_the_primer_ends_one_token_past_the_shared_prefix() -> None:
    assert priming_prompt([5, 6, 7]) == [5, 6, 7, 7]
    with pytest.raises(ValueError, match="empty"):
        priming_prompt([])


def test_the_cache_config_is_read_from_vllms_labels() -> None:
    config = EngineCacheConfig.from_labels({
        "block_size": "2944", "prefix_match_unit": "None", "mamba_cache_mode": "align",
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "True",
    })
    assert config == EngineCacheConfig(2944, None, "align")
    assert config.hybrid
    assert config.match_unit is None


# --- through the gateway, against the simulator's hybrid engine --------------------------------------------


def _samples(gateway: ThreadedServer, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def _primings(gateway: ThreadedServer, engine: str, reason: str) -> float:
    samples = _samples(gateway, "modgate_prefix_primings_total")
    return samples.get((("engine", engine), ("reason", reason)), 0.0)


def _moderate(gateway: ThreadedServer, text: str) -> dict[str, Any]:
    response = httpx.post(f"{gateway.url}/v1/moderations", json={"model": "m", "input": text}, timeout=60,
                          headers={"X-Modgate-Thinking": "off"})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["results"][0]["modgate"]
    return result


def _readyz(gateway: ThreadedServer, engine: str) -> dict[str, Any]:
    body = httpx.get(f"{gateway.url}/readyz", timeout=10).json()
    state: dict[str, Any] = body["prefix_cache"][engine]
    return state


def _texts(start: int, count: int) -> list[str]:
    body = "这段文字讨论天气和路况，没有别的内容。" * 12
    return [f"第{i}条评论：{body}" for i in range(start, start + count)]


SETTINGS: dict[str, Any] = {"shaping": {"prefix_reprime_interval_s": 0.0, "verdict_cache_ttl_s": 0.0}}


def test_the_gateway_primes_a_match_unit_engine_at_start_and_every_request_hits(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    engine = start_sim("hybrid-cpu", prefix_match_unit=16)
    gateway = start_gateway(engine={"url": engine.url}, **SETTINGS)
    state = _readyz(gateway, engine.url)
    assert (state["strategy"], state["primed"], state["primings"]) == ("prime", True, 1)
    expected = min(state["expected_cached_tokens"].values())
    assert expected >= 300  # the shared prefix (300-odd tokens), in whole 16-token units
    assert _primings(gateway, engine.url, "start") == 1
    cached = [_moderate(gateway, text)["cached_tokens"] for text in _texts(0, 4)]
    assert all(tokens >= expected for tokens in cached), cached


def test_an_engine_that_lost_the_state_is_primed_again_without_a_failed_call_or_another_verdict(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    preset = PRESETS["hybrid-cpu"].scaled(prefix_match_unit=16)
    engine = ThreadedServer(create_sim_app(preset, 0.0)).start()
    try:
        gateway = start_gateway(engine={"url": engine.url}, **SETTINGS)
        reference_engine = start_sim("hybrid-cpu", prefix_match_unit=16)
        reference = start_gateway(engine={"url": reference_engine.url},
                                  shaping={"prefix_strategy": "off", "verdict_cache_ttl_s": 0.0})
        expected = min(_readyz(gateway, engine.url)["expected_cached_tokens"].values())
        before = _texts(0, 2)
        assert all(_moderate(gateway, text)["cached_tokens"] >= expected for text in before)
        engine.stop()  # the engine restarts: its cache is gone
        engine = ThreadedServer(create_sim_app(preset, 0.0), port=engine.port).start()
        after = _texts(10, 6)
        results = []
        for text in after:
            results.append(_moderate(gateway, text))
            for _ in range(200):  # the priming runs beside the requests: let it land before the next one
                if _primings(gateway, engine.url, "cache_fell") >= 1:
                    break
                time.sleep(0.01)
        assert results[0]["cached_tokens"] == 0  # the first request after the restart found nothing
        assert _primings(gateway, engine.url, "cache_fell") == 1
        # from the first request after the priming answered on (the loop above waited for it)
        assert all(result["cached_tokens"] >= expected for result in results[1:]), results
        assert _readyz(gateway, engine.url)["primings"] == 2
        # the same verdicts a gateway that never primes gets from the same engine law
        assert [r["action"] for r in results] == [_moderate(reference, t)["action"] for t in after]
    finally:
        engine.stop()


def test_an_engine_that_cannot_cache_the_prefix_says_so_and_names_the_flag(
    start_sim: SimFactory, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    engine = start_sim("hybrid-cpu")
    with caplog.at_level("ERROR", logger="modgate.prefix"):
        gateway = start_gateway(engine={"url": engine.url}, shaping={"prefix_fill_max_tokens": 1024})
    state = _readyz(gateway, engine.url)
    assert state["strategy"] == "uncacheable"
    assert state["fix"] == "start vLLM with --prefix-match-unit 16"
    assert _samples(gateway, "modgate_prefix_uncacheable") == {(("engine", engine.url),): 1.0}
    assert [r.message for r in caplog.records if "--prefix-match-unit 16" in r.message]
    console = httpx.get(f"{gateway.url}/console", timeout=30,
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": "ops"})
    assert console.status_code == 200
    assert "cannot cache the shared prefix: start vLLM with --prefix-match-unit 16" in console.text


def test_llamacpp_is_left_as_it_is(start_sim: SimFactory, start_gateway: GatewayFactory) -> None:
    engine = start_sim("instant", kind="llamacpp")
    gateway = start_gateway(engine={"url": engine.url})
    state = _readyz(gateway, engine.url)
    assert (state["strategy"], state["primings"]) == ("none", 0)
    assert _primings(gateway, engine.url, "start") == 0
