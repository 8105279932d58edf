"""The engine client reads its streamed answer's lines itself: any length, any chunking, any line end."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.engine.client import EngineClient
from gateway.engine.stream_lines import engine_json, sse_lines
from gateway.errors import UpstreamTimeout

ANSWER = '{"verdict":"allow","categories":[]}'


def big_chunk(entries: int) -> dict[str, Any]:
    """A content chunk with ``entries`` logprob entries of 20 alternatives each (a real vLLM line with
    ``top_logprobs`` and a long answer exceeds 512 KiB like this)."""
    top = [{"token": f"tok{i}", "logprob": -1.5 - i, "bytes": [116, 111, 107]} for i in range(20)]
    content = [{"token": "x", "logprob": -0.01, "bytes": [120], "top_logprobs": top}] * entries
    return {"choices": [{"index": 0, "delta": {"content": ANSWER}, "logprobs": {"content": content},
                         "finish_reason": None}]}


def sse_body(end: bytes) -> bytes:
    """A vLLM stream whose second line is over 512 KiB, every line ended by ``end``."""
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        big_chunk(700),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 700, "completion_tokens": 9}},
    ]
    body = b"".join(b"data: " + json.dumps(chunk).encode() + end + end for chunk in chunks)
    return body + b"data: [DONE]" + end + end


@contextlib.asynccontextmanager
async def serve_once(body: bytes, piece: int, *, stall_s: float = 0.0) -> AsyncIterator[str]:
    """A real TCP server that answers chat calls with ``body`` in pieces of ``piece`` bytes (chunked),
    each its own write and drain, after waiting ``stall_s``; yields its URL, and closes every connection."""
    writers: list[asyncio.StreamWriter] = []
    handlers: list[asyncio.Task[None]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        headers = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in headers.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(stall_s)
        for start in range(0, len(body), piece):
            part = body[start : start + piece]
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await answer(reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        for writer in writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await server.wait_closed()


def chat_body() -> dict[str, Any]:
    return {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("piece", [7_001, 65_536])
async def test_a_stream_line_over_512_kib_over_a_real_socket_is_read_whole(end: bytes, piece: int) -> None:
    body = sse_body(end)
    assert max(len(line) for line in body.splitlines()) > 512 * 1024
    async with serve_once(body, piece) as url:
        client = EngineClient(url, connect_timeout_s=2, first_token_timeout_s=10, total_timeout_s=20,
                              connect_retries=0, max_connections=2, kind="vllm")
        try:
            answer = await client.chat(chat_body(), "req-big")
        finally:
            await client.aclose()
    assert answer.content == ANSWER
    assert answer.finish_reason == "stop"
    assert answer.logprobs is not None
    assert len(answer.logprobs) == 700
    assert answer.logprobs[0].top[19] == ("tok19", -20.5)
    assert answer.usage.completion_tokens == 9
    assert answer.ttft_s is not None


async def test_no_first_token_within_the_deadline_over_a_real_socket_is_a_timeout() -> None:
    async with serve_once(sse_body(b"\n"), 4096, stall_s=3.0) as url:
        client = EngineClient(url, connect_timeout_s=2, first_token_timeout_s=0.5, total_timeout_s=20,
                              connect_retries=0, max_connections=2, kind="vllm")
        try:
            with pytest.raises(UpstreamTimeout, match="first token"):
                await client.chat(chat_body(), "req-slow")
        finally:
            await client.aclose()


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.mark.parametrize(
    ("parts", "lines"),
    [
        ((b"data: a\n\ndata: b\n\n",), [b"data: a", b"data: b"]),
        ((b"da", b"ta: a", b"\n", b"\ndata: b"), [b"data: a", b"data: b"]),  # cut anywhere, no final end
        ((b"data: a\r", b"\n\r\ndata: b\r\n\r\n"), [b"data: a", b"data: b"]),  # "\r\n" cut in two
        ((b"data: a\rdata: b\r\r",), [b"data: a", b"data: b"]),  # lone "\r" ends
        ((b"", b"\n\n\n"), []),
    ],
)
async def test_lines_are_split_like_httpx_splits_them(parts: tuple[bytes, ...], lines: list[bytes]) -> None:
    assert [line async for line in sse_lines(pieces(*parts))] == lines


def test_json_reads_what_the_standard_parser_read() -> None:
    assert engine_json(b'{"logprob": -Infinity, "n": 123456789012345678901234567890}') == {
        "logprob": float("-inf"), "n": 123456789012345678901234567890,
    }
    assert engine_json(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    with pytest.raises(ValueError, match="Expecting property name"):
        engine_json(b"{not json")
