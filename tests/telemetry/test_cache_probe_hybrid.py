"""``modgate cache probe`` on a hybrid engine: block against shared prefix, match unit, primed or not."""

from __future__ import annotations

from cli.cache_probe import probe_engine
from tests.support import GatewayFactory, SimFactory


async def test_a_hybrid_engine_without_a_match_unit_is_told_the_flag(start_sim: SimFactory) -> None:
    sim = start_sim("hybrid-cpu")
    report = await probe_engine(sim.url, seed=1)
    assert report.production.cached_tokens == 0
    assert any("block 2,176 > shared prefix" in line and "--prefix-match-unit 16" in line
               for line in report.diagnosis), report.diagnosis


async def test_a_match_unit_engine_is_said_unprimed_then_primed_once_a_gateway_primed_it(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim("hybrid-cpu", prefix_match_unit=16)
    unprimed = await probe_engine(sim.url, seed=1)
    said = unprimed.diagnosis
    assert any(line.startswith("match unit 16, but not primed") for line in said), said
    start_gateway(engine_url=sim.url)  # default settings: it primes at start
    primed = await probe_engine(sim.url, seed=2)
    assert primed.production.cached_tokens > 0
    assert any(line.startswith("match unit 16: primed") for line in primed.diagnosis), primed.diagnosis
