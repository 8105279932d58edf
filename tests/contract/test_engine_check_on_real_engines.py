"""The start-up check against the real engines the contract suite boots: started as modgate starts them, they
lack nothing the gateway needs (a check that reads a real answer wrongly would say otherwise)."""

from __future__ import annotations

import pytest

from gateway.engine.client import EngineClient
from gateway.engine.startup_check import CHECKS, CheckTargets, check_engine


async def checked(url: str) -> dict[str, bool | None]:
    client = EngineClient(url, connect_timeout_s=5, first_token_timeout_s=120, total_timeout_s=300,
                          connect_retries=0, max_connections=2)
    try:
        await client.wire()
        found = await check_engine(client, client.slots or 1, CheckTargets("auto", 10))
    finally:
        await client.aclose()
    assert [check.check for check in found] == list(CHECKS)
    return {check.check: check.ok for check in found}


@pytest.mark.vllm
async def test_the_real_vllm_engine_has_what_the_gateway_needs(real_engine_url: str) -> None:
    found = await checked(real_engine_url)
    assert not [name for name, ok in found.items() if ok is False], found
    assert found["cached_tokens"] is True
    assert found["reasoning_split"] is True
    assert found["logprobs"] is True


@pytest.mark.llamacpp
async def test_the_real_llamacpp_server_has_what_the_gateway_needs(real_llamacpp_url: str) -> None:
    found = await checked(real_llamacpp_url)
    assert not [name for name, ok in found.items() if ok is False], found
