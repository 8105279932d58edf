"""The engine checked at start: each missing piece is found, said once with its fix, and serving goes on."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from gateway.engine.client import EngineClient
from gateway.engine.startup_check import CHECKS, CheckTargets, EngineChecks, check_engine
from gateway.http.app import create_app
from gateway.settings import EngineSettings, Settings
from tests.support import SimFactory, forward

Answer = tuple[int, dict[str, Any]] | None  # a status and body answered instead, or None: the one edited
Alter = Callable[[str, dict[str, Any], dict[str, Any]], Answer]


def without_cached_tokens(path: str, sent: dict[str, Any], answer: dict[str, Any]) -> None:
    """vLLM without --enable-prompt-tokens-details: usage has no prompt_tokens_details."""
    if path == "/v1/chat/completions":
        answer.get("usage", {}).pop("prompt_tokens_details", None)


def without_reasoning_parser(path: str, sent: dict[str, Any], answer: dict[str, Any]) -> None:
    """vLLM without --reasoning-parser: the thought comes back in content (a whole answer or a chunk)."""
    for choice in answer.get("choices", []):
        for part in (choice.get("message"), choice.get("delta")):
            if isinstance(part, dict):
                thought = part.pop("reasoning", None) or part.pop("reasoning_content", None)
                if thought:
                    part["content"] = f"{thought}{part.get('content') or ''}"


def without_structured_outputs(path: str, sent: dict[str, Any], answer: dict[str, Any]) -> None:
    """An engine that ignores the constraint: free text comes back."""
    for choice in answer.get("choices", []):
        if choice.get("message", {}).get("content"):
            choice["message"]["content"] = "I would say allow."


def few_logprobs(path: str, sent: dict[str, Any], answer: dict[str, Any]) -> Answer:
    """vLLM's --max-logprobs below what is asked: the request is refused."""
    if path == "/v1/chat/completions" and (sent.get("top_logprobs") or 0) > 5:
        message = f"Requested top logprobs of {sent['top_logprobs']}, which is greater than max allowed: 5"
        return 400, {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    return None


def without_prefix_caching(path: str, sent: dict[str, Any], answer: dict[str, Any]) -> None:
    """Handled on the /metrics text (see ``altered_engine``)."""


MISSING: dict[str, tuple[Alter, str]] = {
    "cached_tokens": (without_cached_tokens, "--enable-prompt-tokens-details"),
    "reasoning_split": (without_reasoning_parser, "--reasoning-parser qwen3"),
    "structured_outputs": (without_structured_outputs, "structured outputs"),
    "logprobs": (few_logprobs, "--max-logprobs 10"),
    "prefix_caching": (without_prefix_caching, "--enable-prefix-caching"),
}


def altered_engine(url: str, alter: Alter, prefix_caching: bool = True) -> httpx.MockTransport:
    """The simulator at ``url`` with one feature taken away by ``alter`` (it edits the answer in place or
    answers instead)."""

    async def handle(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content) if request.content else {}
        response = await forward(request, url)
        if request.url.path == "/metrics" and not prefix_caching:
            text = response.text.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
            return httpx.Response(200, text=text)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            lines = []
            for line in response.text.splitlines():
                if line.startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    alter(request.url.path, sent, chunk)
                    line = f"data: {json.dumps(chunk)}"
                lines.append(line)
            stream = {"content-type": "text/event-stream"}
            return httpx.Response(200, text="\n".join(lines) + "\n", headers=stream)
        if response.headers.get("content-type", "").startswith("application/json"):
            answer = response.json()
            replaced = alter(request.url.path, sent, answer)
            if replaced is not None:
                return httpx.Response(replaced[0], json=replaced[1])
            return httpx.Response(response.status_code, json=answer)
        return response

    return httpx.MockTransport(handle)


def client_for(transport: httpx.AsyncBaseTransport) -> EngineClient:
    return EngineClient("http://engine.test", connect_timeout_s=5, first_token_timeout_s=30,
                        total_timeout_s=60, connect_retries=0, max_connections=4, transport=transport,
                        kind="vllm")


async def test_the_simulator_has_everything_the_gateway_needs(start_sim: SimFactory) -> None:
    sim = start_sim()
    client = client_for(altered_engine(sim.url, lambda *_: None))
    try:
        found = await check_engine(client, 8, CheckTargets("auto", 10))
    finally:
        await client.aclose()
    assert [check.check for check in found] == list(CHECKS)
    assert not [check for check in found if check.ok is False], found


@pytest.mark.parametrize("missing", sorted(MISSING))
async def test_an_engine_missing_one_feature_is_told_that_one_with_its_fix(
    start_sim: SimFactory, missing: str
) -> None:
    alter, fix = MISSING[missing]
    sim = start_sim()
    client = client_for(altered_engine(sim.url, alter, prefix_caching=missing != "prefix_caching"))
    try:
        found = await check_engine(client, 8, CheckTargets("auto", 10))
    finally:
        await client.aclose()
    failed = [check for check in found if check.ok is False]
    assert [check.check for check in failed] == [missing], failed
    assert fix in failed[0].fix
    assert failed[0].meanwhile  # what the gateway cannot do until then


async def test_a_model_setting_the_engine_does_not_serve_is_told(start_sim: SimFactory) -> None:
    sim = start_sim()
    client = client_for(altered_engine(sim.url, lambda *_: None))
    try:
        found = await check_engine(client, 8, CheckTargets("no-such-model", 10))
    finally:
        await client.aclose()
    served = next(check for check in found if check.check == "served_model")
    assert served.ok is False
    assert "--served-model-name no-such-model" in served.fix


async def test_a_llamacpp_engine_with_fewer_slots_than_the_cap_is_told(start_sim: SimFactory) -> None:
    sim = start_sim(kind="llamacpp")
    client = EngineClient(sim.url, connect_timeout_s=5, first_token_timeout_s=30, total_timeout_s=60,
                          connect_retries=0, max_connections=4)
    try:
        await client.wire()
        assert client.slots is not None
        found = await check_engine(client, client.slots + 1, CheckTargets("auto", 10))
    finally:
        await client.aclose()
    seqs = next(check for check in found if check.check == "max_num_seqs")
    assert seqs.ok is False
    assert f"--parallel {client.slots + 1}" in seqs.fix
    assert not [check for check in found if check.ok is False and check.check != "max_num_seqs"], found


async def test_each_finding_is_logged_once_and_set_in_the_metric(
    start_sim: SimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    sim = start_sim()
    client = client_for(altered_engine(sim.url, without_cached_tokens))
    recorded: list[tuple[str, bool | None]] = []
    checks = EngineChecks([(client, 8)], CheckTargets("auto", 10),
                          record=lambda check: recorded.append((check.check, check.ok)))
    try:
        with caplog.at_level(logging.INFO, logger="modgate.engine"):
            await checks.run()
    finally:
        await client.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "cached_tokens" in warnings[0]
    assert "--enable-prompt-tokens-details" in warnings[0]
    assert ("cached_tokens", False) in recorded
    assert ("logprobs", True) in recorded


async def test_a_vllm_without_prompt_tokens_details_is_named_in_readyz_metrics_console_and_log(
    start_sim: SimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    sim = start_sim()
    settings = Settings(auth={"admin_token": "test-admin-token-0123456789"},  # the check: off in the suite
                        engine=EngineSettings(startup_check=True, url="http://engine.test"))
    app = create_app(settings, engine_transport=altered_engine(sim.url, without_cached_tokens))
    with caplog.at_level(logging.WARNING, logger="modgate.engine"):
        async with AsyncTestClient(app) as http:
            for _ in range(200):
                ready = (await http.get("/readyz")).json()
                if ready.get("engine_checks"):
                    break
                await asyncio.sleep(0.05)
            checks = {check["check"]: check for check in ready["engine_checks"]}
            assert checks["cached_tokens"]["ok"] is False
            assert checks["cached_tokens"]["fix"] == "--enable-prompt-tokens-details"
            assert ready["status"] == "ready"  # the gateway serves what it can
            metrics = (await http.get("/metrics")).text
            assert (await http.post("/v1/moderations", json={"input": "some text"})).status_code == 200
            admin = {"Authorization": "Bearer test-admin-token-0123456789"}
            health = (await http.get("/console/panels", headers=admin)).json()["panels"]["health"]
            assert "cached tokens missing" in health
            assert "--enable-prompt-tokens-details" in health
            assert 'modgate_engine_check{check="cached_tokens",engine="http://engine.test"} 0.0' in metrics
            assert 'modgate_engine_check{check="logprobs",engine="http://engine.test"} 1.0' in metrics
    said = [r.getMessage() for r in caplog.records if "--enable-prompt-tokens-details" in r.getMessage()]
    assert len(said) == 1, said


async def test_with_the_check_off_nothing_is_asked_of_the_engine(start_sim: SimFactory) -> None:
    sim = start_sim()
    asked: list[str] = []

    def note(path: str, sent: dict[str, Any], answer: dict[str, Any]) -> None:
        asked.append(path)

    settings = Settings(engine=EngineSettings(startup_check=False, url="http://engine.test"))
    app = create_app(settings, engine_transport=altered_engine(sim.url, note))
    async with AsyncTestClient(app) as http:
        ready = (await http.get("/readyz")).json()
    assert ready["engine_checks"] == []
    assert "/v1/chat/completions" not in asked
