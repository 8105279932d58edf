"""``modgate_engine_calls_total`` counts what happened to a call's answer, not its status line: an engine
that stalls after its headers is a ``timeout``, one that drops the connection mid-answer an ``error``, a
caller who leaves ``cancelled``; only a whole answer is ``ok``. A fake engine (a real local HTTP server)
plays each fault."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.client import EngineClient
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.series.metrics import GatewayMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CHUNK = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "allow"}, "finish_reason": None}]}
LAST = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
WHOLE = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "allow"},
                      "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def whole_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for part in (event(CHUNK), event(LAST), b"data: [DONE]\n\n"):
        await response.write(part)
    await response.write_eof()
    return response


async def stall_after_headers(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await asyncio.sleep(30)
    return response


async def stall_after_first_token(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(event(CHUNK))
    await asyncio.sleep(30)
    return response


async def drop_mid_answer(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(event(CHUNK))
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # the connection gone mid-answer, the chunked body never ended
    return response


async def whole_json(request: web.Request) -> web.StreamResponse:
    return web.json_response(WHOLE)


async def stall_json_after_headers(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = 4096
    await response.prepare(request)
    await response.write(b'{"choices": ')
    await asyncio.sleep(30)
    return response


@pytest.fixture
async def fake_engine() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Start a fake engine whose ``/v1/chat/completions`` is the given handler; its base URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


STALLS = {"first_token_s": 0.5, "total_s": 1.5}
"""Short deadlines, for the tests that wait for a stalled engine's timeout; the others take roomy ones, so
that a loaded machine's slow first chunk never turns their answer into a timeout."""


def client_for(url: str, metrics: GatewayMetrics, *, first_token_s: float = 10.0,
               total_s: float = 20.0) -> EngineClient:
    client = EngineClient(
        url, connect_timeout_s=2.0, first_token_timeout_s=first_token_s, total_timeout_s=total_s,
        connect_retries=0, max_connections=4, kind="vllm",
    )
    client.count_calls(metrics.engine_call)
    return client


def outcomes(metrics: GatewayMetrics) -> dict[tuple[str, str], float]:
    """``modgate_engine_calls_total`` as ``{(purpose, outcome): count}``, read from the exposition."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        if family.name == "modgate_engine_calls":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value:
                    found[sample.labels["purpose"], sample.labels["outcome"]] = sample.value
    return found


def body(stream: bool) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "judge"}], "stream": stream}


@pytest.mark.parametrize("stream", [True, False])
async def test_a_whole_answer_is_counted_ok(
    fake_engine: Callable[[Handler], Awaitable[str]], stream: bool
) -> None:
    metrics = GatewayMetrics()
    async with client_for(await fake_engine(whole_stream if stream else whole_json), metrics) as client:
        answer = await client.chat(body(stream), "req-1")
    assert answer.content == "allow"
    assert outcomes(metrics) == {("verdict", "ok"): 1}


@pytest.mark.parametrize(
    ("handler", "stream"),
    [(stall_after_headers, True), (stall_after_first_token, True), (stall_json_after_headers, False)],
)
async def test_an_engine_that_stalls_after_its_headers_is_counted_a_timeout(
    fake_engine: Callable[[Handler], Awaitable[str]], handler: Handler, stream: bool
) -> None:
    metrics = GatewayMetrics()
    async with client_for(await fake_engine(handler), metrics, **STALLS) as client:
        with pytest.raises(UpstreamTimeout):
            await client.chat(body(stream), "req-1")
    assert outcomes(metrics) == {("verdict", "timeout"): 1}


async def test_a_connection_dropped_mid_answer_is_counted_an_error(
    fake_engine: Callable[[Handler], Awaitable[str]],
) -> None:
    metrics = GatewayMetrics()
    async with client_for(await fake_engine(drop_mid_answer), metrics) as client:
        with pytest.raises(UpstreamError):
            await client.chat(body(True), "req-1")
    assert outcomes(metrics) == {("verdict", "error"): 1}


async def test_a_caller_who_leaves_mid_answer_is_counted_cancelled(
    fake_engine: Callable[[Handler], Awaitable[str]],
) -> None:
    metrics = GatewayMetrics()
    async with client_for(await fake_engine(stall_after_first_token), metrics) as client:
        call = asyncio.create_task(client.chat(body(True), "req-1"))
        await asyncio.sleep(0.2)  # the first token came; the answer is under way
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert outcomes(metrics) == {("verdict", "cancelled"): 1}


async def test_a_probe_whose_engine_stalls_after_its_headers_is_counted_a_timeout(
    fake_engine: Callable[[Handler], Awaitable[str]],
) -> None:
    metrics = GatewayMetrics()
    async with client_for(await fake_engine(stall_json_after_headers), metrics, **STALLS) as client:
        with pytest.raises(UpstreamTimeout):
            await client.request("POST", "/v1/chat/completions", purpose="probe", json=body(False))
    assert outcomes(metrics) == {("probe", "timeout"): 1}
