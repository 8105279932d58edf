"""The prefix strategy is decided per engine, at start and again when the gateway notices an engine restarted
or swapped: two simulated engines of different block sizes, one swapped to a hybrid model with a match unit,
the other restarted."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import GatewayFactory, SwappableEngine

HYBRID_WITH_UNIT: dict[str, Any] = {"mamba_cache_mode": "align", "block_size": 1024, "prefix_match_unit": 16}
WATCH_S = 0.2  # MODGATE_ENGINE__MODEL_RECHECK_S: how often the gateway reads each engine again


@pytest.fixture
def engines() -> Iterator[tuple[SwappableEngine, SwappableEngine]]:
    """A hybrid engine with a 2,048-token block and a match unit, and a plain one with 16-token blocks."""
    hybrid, plain = SwappableEngine(), SwappableEngine()
    hybrid.swap(**{**HYBRID_WITH_UNIT, "block_size": 2048})
    yield hybrid, plain
    hybrid.stop()
    plain.stop()


def _prefix(gateway: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{gateway}/readyz", timeout=30).json()["prefix_cache"]
    return body


def _primings(gateway: str, engine: str) -> dict[str, float]:
    text = httpx.get(f"{gateway}/metrics", timeout=10).text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "modgate_prefix_primings_total" and sample.labels["engine"] == engine
    }


def _until(what: Callable[[], bool]) -> None:
    for _ in range(300):
        if what():
            return
        time.sleep(0.05)
    raise AssertionError("the gateway did not notice within 15 s")


def test_each_engine_gets_its_own_strategy_and_a_new_one_after_a_swap_or_restart(
    engines: tuple[SwappableEngine, SwappableEngine], start_gateway: GatewayFactory
) -> None:
    hybrid, plain = engines
    gateway = start_gateway(
        engine={"model_recheck_s": WATCH_S, "url": f"{hybrid.url},{plain.url}"},
        shaping={"prefix_reprime_interval_s": 0.0, "verdict_cache_ttl_s": 0.0},
    ).url
    start = _prefix(gateway)
    assert (start[hybrid.url]["strategy"], start[hybrid.url]["primings"]) == ("prime", 1)
    assert (start[plain.url]["strategy"], start[plain.url]["primings"]) == ("none", 0)
    expected = min(start[hybrid.url]["expected_cached_tokens"].values())
    assert expected > 0

    # The plain engine is swapped for a hybrid model with a match unit: the gateway decides again and primes.
    plain.swap(**HYBRID_WITH_UNIT)
    _until(lambda: _prefix(gateway)[plain.url]["primed"])
    assert _prefix(gateway)[plain.url]["strategy"] == "prime"
    assert sum(_primings(gateway, plain.url).values()) == 1
    assert min(_prefix(gateway)[plain.url]["expected_cached_tokens"].values()) == expected

    # The first engine restarts (same flags, cache gone): it is primed again as soon as it answers.
    hybrid.stop()
    time.sleep(5 * WATCH_S)  # the gateway reads it while it is down
    hybrid.start(**{**HYBRID_WITH_UNIT, "block_size": 2048})
    _until(lambda: _primings(gateway, hybrid.url).get("restart", 0) >= 1)
    assert _prefix(gateway)[hybrid.url]["strategy"] == "prime"
    assert _primings(gateway, hybrid.url).get("start") == 1
