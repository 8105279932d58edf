"""Engine faults become 502/503/504 in the OpenAI error shape within the deadline; the gateway stays up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from bench.servers import free_port, wait_until_ready
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.processes import poll, poll_async
from tests.reliability.conftest import engine_counter, error_body
from tests.support import GatewayFactory, SimFactory, image_input

BODY = {"input": image_input(make_keyframe("allow", 320, 180))}


def sse(*chunks: dict[str, Any]) -> bytes:
    """A server-sent event stream of chat completion chunks, ended with [DONE]."""
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


ANSWER = sse(
    {
        "choices": [
            {
                "index": 0,
                "finish_reason": None,
                "delta": {"content": '{"verdict": "allow", "categories": [], "confidence": 0.9}'},
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)


class ScriptedEngine:
    """An engine made of an async handler; counts the chat calls it received."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.chat_calls = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        self.chat_calls += 1
        result: httpx.Response = await self.answer(request, self.chat_calls)
        return result


async def call_gateway(engine: ScriptedEngine, **settings: Any) -> httpx.Response:
    """One moderation through an in-process gateway whose engine is ``engine``."""
    settings_ = Settings(engine={"model": "m", **settings})
    app = create_app(settings_, engine_transport=httpx.MockTransport(engine))
    async with AsyncTestClient(app, timeout=30) as client:
        response = await client.post("/v1/moderations", json=BODY)
        assert (await client.get("/healthz")).status_code == 200  # and the gateway is still up
    return response


async def call_gateway_on_sim(
    start_sim: SimFactory, start_gateway: GatewayFactory, faults: Faults, **settings: Any
) -> httpx.Response:
    """One moderation over HTTP through a gateway (``settings``) in front of a simulator with ``faults``."""
    sim = start_sim(faults=faults)
    gateway = start_gateway(**{**settings, "engine": {"url": sim.url, **settings.get("engine", {})}})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        return await client.post("/v1/moderations", json=BODY)


def stream_of(*parts: bytes | BaseException | float) -> httpx.AsyncByteStream:
    """A response body that yields bytes, raises an exception, or sleeps (a float), in order."""

    class Scripted(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for part in parts:
                if isinstance(part, BaseException):
                    raise part
                if isinstance(part, float):
                    await asyncio.sleep(part)
                    continue
                yield part

    return Scripted()


FIRST_CHUNK = b'data: {"choices": [{"index": 0, "delta": {"reasoning": "hm"}, "finish_reason": null}]}\n\n'


async def test_an_engine_500_becomes_a_502(start_sim: SimFactory, start_gateway: GatewayFactory) -> None:
    response = await call_gateway_on_sim(start_sim, start_gateway, Faults(error_rate=1.0))
    assert response.status_code == 502
    error = error_body(response)
    assert (error["type"], error["code"]) == ("server_error", "engine_bad_response")


async def test_an_engine_503_becomes_a_503() -> None:
    async def busy(request: httpx.Request, call: int) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "overloaded"}})

    response = await call_gateway(ScriptedEngine(busy))
    assert response.status_code == 503
    assert error_body(response)["code"] == "engine_unavailable"


async def test_a_malformed_stream_chunk_becomes_a_502() -> None:
    async def garbled(request: httpx.Request, call: int) -> httpx.Response:
        return httpx.Response(
            200,
            stream=stream_of(FIRST_CHUNK, b"data: {not json\n\n"),
            headers={"content-type": "text/event-stream"},
        )

    response = await call_gateway(ScriptedEngine(garbled))
    assert response.status_code == 502
    assert "malformed" in error_body(response)["message"]


async def test_a_stream_cut_in_the_middle_becomes_a_502(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    response = await call_gateway_on_sim(start_sim, start_gateway, Faults(cut_stream_rate=1.0))
    assert response.status_code == 502
    assert "ended before the answer was complete" in error_body(response)["message"]


async def test_a_model_answer_that_is_not_json_becomes_a_review_verdict(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    response = await call_gateway_on_sim(start_sim, start_gateway, Faults(malformed_rate=1.0))
    assert response.status_code == 200
    details = response.json()["results"][0]["modgate"]
    assert details["action"] == "review"
    assert details["reason"]


async def test_an_engine_that_never_answers_gets_504_at_the_first_token_deadline() -> None:
    async def hung(request: httpx.Request, call: int) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    response = await call_gateway(ScriptedEngine(hung), first_token_timeout_s=0.3, total_timeout_s=60)
    assert response.status_code == 504
    error = error_body(response)
    assert (error["code"], "first-token" in error["message"]) == ("engine_timeout", True)


async def test_a_slow_engine_past_the_first_token_deadline_gets_504(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    response = await call_gateway_on_sim(
        start_sim, start_gateway, Faults(slow_rate=1.0, slow_s=30.0), engine={"first_token_timeout_s": 0.5}
    )
    assert response.status_code == 504
    assert error_body(response)["code"] == "engine_timeout"


async def test_a_slow_engine_within_the_deadline_is_answered(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    response = await call_gateway_on_sim(
        start_sim, start_gateway, Faults(slow_rate=1.0, slow_s=0.3), engine={"first_token_timeout_s": 10}
    )
    assert response.status_code == 200
    assert response.json()["results"][0]["modgate"]["action"] == "allow"


async def test_an_engine_that_stalls_after_its_first_token_gets_504_at_the_total_deadline() -> None:
    async def stalls(request: httpx.Request, call: int) -> httpx.Response:
        return httpx.Response(
            200, stream=stream_of(FIRST_CHUNK, 3600.0), headers={"content-type": "text/event-stream"}
        )

    response = await call_gateway(ScriptedEngine(stalls), first_token_timeout_s=5, total_timeout_s=0.5)
    assert response.status_code == 504
    assert "the end of the answer" in error_body(response)["message"]


async def test_refused_connections_are_retried_until_the_engine_answers() -> None:
    async def refuses_twice(request: httpx.Request, call: int) -> httpx.Response:
        if call <= 2:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, content=ANSWER, headers={"content-type": "text/event-stream"})

    engine = ScriptedEngine(refuses_twice)
    response = await call_gateway(engine, connect_retries=3)
    assert response.status_code == 200, response.text
    assert engine.chat_calls == 3


async def test_refused_connections_give_503_once_the_retries_are_spent() -> None:
    async def refuses(request: httpx.Request, call: int) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    engine = ScriptedEngine(refuses)
    response = await call_gateway(engine, connect_retries=2)
    assert response.status_code == 503
    assert error_body(response)["code"] == "engine_unavailable"
    assert engine.chat_calls == 3


async def test_an_unreachable_engines_503_says_when_to_come_back() -> None:
    async def refuses(request: httpx.Request, call: int) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    response = await call_gateway(ScriptedEngine(refuses), connect_retries=0)
    assert response.status_code == 503
    assert error_body(response)["code"] == "engine_unavailable"
    assert int(response.headers["retry-after"]) >= 1


async def test_an_answer_cut_after_it_started_is_never_retried() -> None:
    async def cut(request: httpx.Request, call: int) -> httpx.Response:
        return httpx.Response(
            200,
            stream=stream_of(FIRST_CHUNK, httpx.ReadError("connection reset")),
            headers={"content-type": "text/event-stream"},
        )

    engine = ScriptedEngine(cut)
    response = await call_gateway(engine, connect_retries=3)
    assert response.status_code == 502
    assert engine.chat_calls == 1


@contextlib.contextmanager
def simulator_process(port: int, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``modgate engine-sim`` in a process of its own (so it can be killed)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "engine-sim", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/health", process)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


async def test_the_engine_killed_mid_stream_fails_those_requests_cleanly_and_the_gateway_recovers(
    start_gateway: GatewayFactory,
) -> None:
    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    gateway = start_gateway(

        engine={"connect_retries": 1, "model": "qwen3-vl-moe-sim", "url": engine_url},
        circuit={"cooldown_s": 0.5},
    )
    frames = [make_keyframe("allow", 320, 180, seed=i) for i in range(4)]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
        with simulator_process(port, "--preset", "spark", "--time-scale", "1") as engine:
            calls = [
                asyncio.create_task(client.post("/v1/moderations", json={"input": image_input(frame)}))
                for frame in frames
            ]

            async def all_streaming() -> bool:
                info = (await client.get(f"{engine_url}/sim/info")).json()
                return bool(info["running"] == len(frames))

            await poll_async(all_streaming, 30, "every request to be running in the engine")
            engine.send_signal(signal.SIGKILL)
            engine.wait(10)
            cut = await asyncio.gather(*calls)
        assert [r.status_code for r in cut] == [502] * len(frames), [r.text for r in cut]
        for response in cut:
            assert error_body(response)["type"] == "server_error"
        assert (await client.get("/healthz")).status_code == 200
        down = await client.post("/v1/moderations", json=BODY)
        assert down.status_code == 503
        with simulator_process(port, "--preset", "instant", "--time-scale", "0"):

            async def answered() -> bool:
                return (await client.post("/v1/moderations", json=BODY)).status_code == 200

            await poll_async(answered, 30, "the gateway to use the restarted engine")


async def test_a_client_that_disconnects_cancels_its_engine_request(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    # 512 reasoning tokens at the Spark's own pace (time scale 1): the answer would take about 50 s, so a
    # loaded machine has 45 s to see the disconnect and drop the request before it would end by itself.
    sim = start_sim("spark", time_scale=1.0, reasoning_tokens=2000, reasoning_jitter=0)
    gateway = start_gateway(engine={"url": sim.url})
    async with httpx.AsyncClient(timeout=60) as watcher:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            call = asyncio.create_task(client.post("/v1/moderations", json=BODY))

            async def running(count: int) -> bool:
                return bool((await watcher.get(f"{sim.url}/sim/info")).json()["running"] == count)

            await poll_async(lambda: running(1), 30, "the request to reach the engine")
            call.cancel()  # the client goes away: its connection closes
            with pytest.raises(asyncio.CancelledError):
                await call

        async def engine_idle() -> bool:
            info = (await watcher.get(f"{sim.url}/sim/info")).json()
            return bool(info["running"] == 0 and info["waiting"] == 0)

        await poll_async(engine_idle, 45, "the engine to drop the abandoned request")
        generated = engine_counter((await watcher.get(f"{sim.url}/metrics")).text, "vllm:generation_tokens")
        gateway_metrics = (await watcher.get(f"{gateway.url}/metrics")).text
    assert generated < 512  # stopped well before its max_completion_tokens
    assert "modgate_engine_inflight 0.0" in gateway_metrics


def test_the_poll_helper_fails_when_the_condition_never_holds() -> None:
    with pytest.raises(pytest.fail.Exception):
        poll(lambda: False, 0.1, "nothing")
