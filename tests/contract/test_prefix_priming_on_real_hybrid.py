"""The gateway's default prefix strategy on the real hybrid vLLM started with ``--prefix-match-unit 16``: it
primes the engine, and every text moderation through the official client then takes the shared prefix
(less at most one unit) from the engine's cache, by the engine's own counter."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.pool_build import tool_client
from gateway.engine.prefix import EngineTokens
from gateway.settings import EngineSettings
from shaping.prefix_strategy import priming_prompt
from shaping.prompt import load_system_prompt, prompt_version_for
from shaping.verdict import DEFAULT_VERDICT_FORMAT
from tests.contract.conftest import HYBRID_MATCH_UNIT
from tests.contract.test_hybrid_engine_contract import (
    HYBRID_BLOCK,
    Engine,
    cache_config,
    cached,
    shared_prefix_ids,
    tagged_prompt,
    text_request,
)
from tests.support import GatewayFactory, SimFactory


def _hits(engine_url: str) -> float:
    text = httpx.get(f"{engine_url}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "vllm:prefix_cache_hits" for sample in family.samples
               if sample.name.endswith("_total"))


async def _shared_prefix_tokens(engine_url: str) -> int:
    async with tool_client(engine_url, EngineSettings()) as http:
        engine = await EngineTokens.connect(http)
        system = load_system_prompt(prompt_version_for(DEFAULT_VERDICT_FORMAT))  # what text requests carry
        return await engine.shared_prefix_tokens(system.text)


@pytest.mark.vllm
async def test_default_settings_make_every_text_moderation_hit_the_shared_prefix(
    real_hybrid_url: str, start_gateway: GatewayFactory
) -> None:
    shared = await _shared_prefix_tokens(real_hybrid_url)
    assert shared > 300  # the canonical system turn and the user header
    gateway = start_gateway(engine={"url": real_hybrid_url})  # no prefix setting: the strategy is auto
    ready = httpx.get(f"{gateway.url}/readyz", timeout=60).json()
    assert ready["prefix_cache"][real_hybrid_url]["strategy"] == "prime", ready["prefix_cache"]
    moved = []
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        for index in range(4):
            before = _hits(real_hybrid_url)
            response = client.moderations.create(
                input=f"第{index}条评论：{uuid.uuid4().hex} 今天路上车很多，大家注意安全。",
                extra_headers={"X-Modgate-Thinking": "off"},
            )
            details = response.results[0].model_extra or {}
            assert details["modgate"]["action"] in ("allow", "review", "block")
            moved.append(_hits(real_hybrid_url) - before)
    assert all(hits >= shared - HYBRID_MATCH_UNIT for hits in moved[1:]), (shared, moved)


@pytest.mark.parametrize("column", ["simulator", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_the_simulators_hybrid_law_matches_the_real_engine_unprimed_and_primed(
    column: str, request: pytest.FixtureRequest, start_sim: SimFactory
) -> None:
    """The same requests on the simulator's ``hybrid-cpu`` with the unit and on the real hybrid vLLM: no hit
    before a primer, then the shared prefix to the unit on every request; the same block in the config."""
    if column == "simulator":
        url = start_sim("hybrid-cpu", prefix_match_unit=HYBRID_MATCH_UNIT).url
    else:
        url = str(request.getfixturevalue("real_hybrid_url"))
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    engine = Engine(column, url, model)
    system = tagged_prompt()
    shared = shared_prefix_ids(url, model, system)
    unprimed = [cached(engine.post(text_request(engine, uuid.uuid4().hex, system=system))) for _ in range(2)]
    primer = httpx.post(f"{url}/v1/completions", timeout=300,
                        json={"model": model, "prompt": priming_prompt(shared), "max_tokens": 1})
    assert primer.status_code == 200, primer.text
    primed = [cached(engine.post(text_request(engine, uuid.uuid4().hex, system=system))) for _ in range(2)]
    expected = len(shared) // HYBRID_MATCH_UNIT * HYBRID_MATCH_UNIT
    assert (unprimed, primed) == ([0, 0], [expected, expected]), len(shared)
    labels = cache_config(url)
    assert (labels["block_size"], labels["prefix_match_unit"], labels["mamba_cache_mode"]) == (
        str(HYBRID_BLOCK), str(HYBRID_MATCH_UNIT), "align"
    )
