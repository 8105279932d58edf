"""The gateway's block-filling prefix: the shared prefix filled to the engine's block, so that it hits."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import GatewayFactory, SimFactory, image_input


def moderate(gateway: ThreadedServer, seed: int) -> dict[str, Any]:
    """One keyframe of its own through the gateway, thinking off; its ``modgate`` details."""
    body = {"model": "m", "input": image_input(make_keyframe("allow", 1280, 720, seed=seed))}
    response = httpx.post(
        f"{gateway.url}/v1/moderations", json=body, timeout=60, headers={"X-Modgate-Thinking": "off"}
    )
    assert response.status_code == 200, response.text
    details: dict[str, Any] = response.json()["results"][0]["modgate"]
    return details


def test_on_the_spark_preset_only_the_filled_prefix_is_reused(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    engine = start_sim("spark")
    plain = start_gateway(engine_url=engine.url)
    assert [moderate(plain, seed)["cached_tokens"] for seed in (1, 2, 3)] == [0, 0, 0]
    filled = start_gateway(engine_url=engine.url, shaping={"block_filling_prefix": True})
    calls = [moderate(filled, seed) for seed in (4, 5, 6)]
    assert [call["cached_tokens"] for call in calls] == [0, 2960, 2960]
    plain_prompt = moderate(plain, 7)["prompt_tokens"]
    computed = calls[-1]["prompt_tokens"] - calls[-1]["cached_tokens"]
    assert computed < plain_prompt  # the engine computes fewer tokens per keyframe than without the fill


def test_a_configured_block_size_wins_over_the_engines(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    engine = start_sim("instant", block_size=64)
    shaping = {"block_filling_prefix": True, "prefix_block_size": 256}
    gateway = start_gateway(engine_url=engine.url, shaping=shaping)
    calls = [moderate(gateway, seed) for seed in (11, 12, 13)]
    cached = calls[-1]["cached_tokens"]
    assert cached > 0
    assert cached % 256 == 0


def test_an_engine_that_cannot_be_measured_leaves_the_plain_prompt(
    start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="modgate.gateway"):
        start_gateway(engine_url="http://127.0.0.1:9", shaping={"block_filling_prefix": True})
    assert any("block-filling prefix OFF" in record.getMessage() for record in caplog.records)


def test_llamacpp_has_no_block_to_fill_and_says_so(
    start_sim: SimFactory, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    engine = start_sim("instant", kind="llamacpp")
    with caplog.at_level(logging.ERROR, logger="modgate.gateway"):
        gateway = start_gateway(engine_url=engine.url, shaping={"block_filling_prefix": True})
    refusals = [r.getMessage() for r in caplog.records if "block-filling prefix OFF" in r.getMessage()]
    assert refusals, [r.getMessage() for r in caplog.records]
    assert all("token by token" in message for message in refusals)
    calls = [moderate(gateway, seed) for seed in (21, 22)]
    assert calls[-1]["cached_tokens"] > 0  # the plain prompt's shared prefix, reused as it is
