"""The benchmarks' own parts: the replaying engine stub and the lean keep-alive client."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable

import httpx

from bench.engine_stub import create_stub_app
from bench.keepalive import KeepAliveConnection, encode_request
from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def test_the_engine_stub_replays_the_simulators_answer_byte_for_byte() -> None:
    frame = base64.b64encode(make_keyframe("allow")).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{frame}"}}
    body = {
        "model": "qwen3-vl-moe-sim",
        "messages": [{"role": "system", "content": "Moderate."}, {"role": "user", "content": [image]}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 8,
    }
    with ThreadedServer(create_stub_app()) as stub:
        first = httpx.post(f"{stub.url}/v1/chat/completions", json=body)
        second = httpx.post(f"{stub.url}/v1/chat/completions", json=body)
        info = httpx.get(f"{stub.url}/stub/info").json()
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    assert first.text.rstrip().endswith("data: [DONE]")
    assert '"usage"' in first.text  # the usage chunk the gateway asked for (stream_options)
    assert info == {"distinct_bodies": 1, "distinct_requests": 1, "distinct_since_mark": 1, "requests": 2,
                    "replays": 1}


def test_the_engine_stub_passes_other_routes_to_the_simulator() -> None:
    with ThreadedServer(create_stub_app()) as stub:
        models = httpx.get(f"{stub.url}/v1/models").json()
        tokenized = httpx.post(f"{stub.url}/tokenize", json={"prompt": "请审核"}).json()
    assert models["data"][0]["id"] == "qwen3-vl-moe-sim"
    assert tokenized["count"] > 0


def test_the_engine_stub_does_not_keep_an_error_answer() -> None:
    with ThreadedServer(create_stub_app()) as stub:
        bad = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
        answers = [httpx.post(f"{stub.url}/v1/chat/completions", json=bad) for _ in range(2)]
        info = httpx.get(f"{stub.url}/stub/info").json()
    assert [answer.status_code for answer in answers] == [404, 404]
    assert info == {"distinct_bodies": 0, "distinct_requests": 1, "distinct_since_mark": 1, "requests": 2,
                    "replays": 0}


def test_the_engine_stub_counts_the_requests_since_its_mark_apart() -> None:
    """A gateway's own requests at start (before the benchmark's mark) are not counted as an arm's."""
    def chat(text: str) -> dict[str, object]:
        return {"model": "qwen3-vl-moe-sim", "messages": [{"role": "user", "content": text}], "max_tokens": 2}

    with ThreadedServer(create_stub_app()) as stub:
        httpx.post(f"{stub.url}/v1/chat/completions", json=chat("priming"))
        httpx.post(f"{stub.url}/stub/mark")
        for text in ("keyframe", "keyframe", "priming"):
            httpx.post(f"{stub.url}/v1/chat/completions", json=chat(text))
        info = httpx.get(f"{stub.url}/stub/info").json()
    assert (info["distinct_requests"], info["distinct_since_mark"], info["requests"]) == (2, 2, 4)


async def _serve(handler: StreamHandler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/echo"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


async def test_the_keepalive_client_reads_a_chunked_body_and_reuses_the_connection() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while not reader.at_eof():
            body = await _read_request(reader)
            if not body:
                break
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n" % (len(body), body) + b"3\r\n!!!\r\n0\r\n\r\n")
            await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    connection = KeepAliveConnection(url)
    replies = [await connection.request(encode_request(url, json.dumps({"n": n}).encode())) for n in range(3)]
    await connection.close()
    server.close()
    assert [reply.body for reply in replies] == [b'{"n": 0}!!!', b'{"n": 1}!!!', b'{"n": 2}!!!']
    assert connections == 1


async def test_the_keepalive_client_reopens_a_connection_the_server_closed_while_idle() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # as a keep-alive timeout would, without saying "Connection: close"

    server, url = await _serve(handler)
    connection = KeepAliveConnection(url)
    request = encode_request(url, b"{}")
    first = await connection.request(request)
    await asyncio.sleep(0.05)
    second = await connection.request(request)
    await connection.close()
    server.close()
    assert (first.status, first.body, second.status, second.body) == (200, b"ok", 200, b"ok")
    assert connections == 2
