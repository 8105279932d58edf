"""The engine client's transport (gateway/engine/transport.py) against a scripted HTTP/1.1 server: what it
reuses, what it refuses to reuse, and each failure as the httpx error the engine client maps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from gateway.engine.transport import EngineTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Scripted:
    """A server whose ``n``-th connection is answered by ``handler(reader, writer, n)``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.ended = 0  # connections the client closed (or this server did)
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        finally:
            self.ended += 1
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (by its Content-Length); b"" when the client closed."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + (await reader.readexactly(length) if length else b"")


async def keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
    while True:
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        writer.write(OK)
        await writer.drain()


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Scripted]:
    scripted = Scripted(handler)
    server = await asyncio.start_server(scripted._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    scripted.url = f"http://127.0.0.1:{port}"
    async with server:
        yield scripted


def client(url: str, *, connections: int = 8, expiry: float = 10.0, read: float = 5.0,
           pool: float = 5.0, connect: float = 1.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, keepalive_expiry=expiry)
    return httpx.AsyncClient(base_url=url, transport=EngineTransport(limits),
                             timeout=httpx.Timeout(read, connect=connect, pool=pool))


async def run(handler: Handler, check: Callable[[Scripted], Awaitable[None]]) -> Scripted:
    async with serving(handler) as scripted:
        await check(scripted)
        return scripted


def test_requests_in_turn_share_one_kept_alive_connection() -> None:
    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            for _ in range(5):
                response = await http.post("/v1/chat/completions", content=b'{"a": 1}')
                assert (response.status_code, response.text) == (200, "ok")
        assert server.connections == 1

    asyncio.run(run(keep_answering, check))


def test_a_chunked_stream_is_handed_on_as_it_comes_and_the_connection_kept() -> None:
    release = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
        await release.wait()  # the second line only once the first was read
        writer.write(b"6\r\ndata:2\r\n0\r\n\r\n")
        await keep_answering(reader, writer, 0)

    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            async with http.stream("POST", "/v1/chat/completions", content=b"{}") as response:
                seen = []
                async for chunk in response.aiter_raw():
                    seen.append(chunk)
                    release.set()
                assert seen == [b"data:1", b"data:2"]
            assert (await http.get("/health")).text == "ok"
        assert server.connections == 1

    asyncio.run(run(stream, check))


def test_a_body_left_unread_closes_its_connection() -> None:
    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            async with http.stream("GET", "/big"):
                pass  # not read
            assert (await http.get("/health")).text == "ok"
        assert server.connections == 2

    async def big_then_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 50_000)
            await writer.drain()
            await asyncio.sleep(0.5)
            return
        await keep_answering(reader, writer, n)

    asyncio.run(run(big_then_ok, check))


async def answer_once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    """The first connection answers one request, takes the second and closes unanswered; later ones answer."""
    await read_request(reader)
    writer.write(OK)
    await writer.drain()
    if n == 1:
        await read_request(reader)


def test_a_post_on_a_connection_the_engine_closed_unanswered_is_not_sent_again() -> None:
    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            assert (await http.post("/v1/chat/completions", content=b"{}")).text == "ok"
            with pytest.raises(httpx.RemoteProtocolError, match="closed the connection before answering"):
                await http.post("/v1/chat/completions", content=b"{}")
        assert server.connections == 1

    asyncio.run(run(answer_once_then_close, check))


def test_a_get_on_a_connection_the_engine_closed_is_asked_again_on_a_new_one() -> None:
    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            assert (await http.get("/props")).text == "ok"
            assert (await http.get("/props")).text == "ok"
        assert server.connections == 2

    asyncio.run(run(answer_once_then_close, check))


def test_a_connection_the_engine_closed_while_idle_is_not_used_again() -> None:
    async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()

    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            for _ in range(3):
                assert (await http.post("/v1/chat/completions", content=b"{}")).text == "ok"
                await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
        assert server.connections == 3

    asyncio.run(run(answer_then_close, check))


def test_a_connection_idle_past_the_expiry_is_replaced() -> None:
    async def check(server: Scripted) -> None:
        async with client(server.url, expiry=0.05) as http:
            assert (await http.get("/health")).text == "ok"
            await asyncio.sleep(0.1)
            assert (await http.get("/health")).text == "ok"
        assert server.connections == 2

    asyncio.run(run(keep_answering, check))


def test_silence_past_the_read_timeout_is_a_read_timeout_in_the_head_and_in_the_body() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
            await writer.drain()
        await asyncio.sleep(2)

    async def check(server: Scripted) -> None:
        async with client(server.url, read=0.2) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/chat/completions", content=b"{}")
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/chat/completions", content=b"{}")

    asyncio.run(run(stall, check))


def test_a_body_cut_short_and_an_answer_that_is_not_http_are_protocol_errors() -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        cut_short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
        writer.write(cut_short if n == 1 else b"SSH-2.0-nope\r\n\r\n")
        await writer.drain()

    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            with pytest.raises(httpx.RemoteProtocolError, match="before the answer was complete"):
                await http.post("/v1/chat/completions", content=b"{}")
            with pytest.raises(httpx.RemoteProtocolError, match=r"not HTTP/1\.1"):
                await http.post("/v1/chat/completions", content=b"{}")

    asyncio.run(run(broken, check))


def test_nothing_listening_is_a_connect_error() -> None:
    async def check() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        async with client(f"http://127.0.0.1:{port}") as http:
            with pytest.raises(httpx.ConnectError):
                await http.post("/v1/chat/completions", content=b"{}")

    asyncio.run(check())


def test_past_the_connection_limit_a_request_waits_for_one_given_back_or_times_out() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            await asyncio.sleep(0.3)
            writer.write(OK)
            await writer.drain()

    async def check(server: Scripted) -> None:
        async with client(server.url, connections=1) as http:
            both = await asyncio.gather(*(http.get("/health") for _ in range(2)))
            assert [r.text for r in both] == ["ok", "ok"]
        assert server.connections == 1
        # the wait for a connection and the connecting share one deadline (pool + connect)
        async with client(server.url, connections=1, pool=0.05, connect=0.05) as http:
            first = asyncio.create_task(http.get("/health"))
            await asyncio.sleep(0.05)
            with pytest.raises(httpx.ConnectTimeout):
                await http.get("/health")
            assert (await first).text == "ok"

    asyncio.run(run(slow, check))


def test_an_answer_read_after_the_transport_closed_closes_its_connection() -> None:
    async def check(server: Scripted) -> None:
        transport = EngineTransport(httpx.Limits(max_connections=2, keepalive_expiry=10))
        async with httpx.AsyncClient(base_url=server.url, transport=transport) as http:
            async with http.stream("GET", "/health") as response:
                await transport.aclose()  # the client shuts down with an answer still being read
                assert await response.aread() == b"ok"
            for _ in range(100):  # the server sees the connection end: it was not pooled again
                if server.ended:
                    break
                await asyncio.sleep(0.01)
            assert server.ended == 1

    asyncio.run(run(keep_answering, check))


def test_a_body_that_runs_to_the_close_is_whole_at_the_close() -> None:
    async def to_the_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nwhole")

    async def check(server: Scripted) -> None:
        async with client(server.url) as http:
            response = await http.post("/v1/chat/completions", content=b"{}")
            assert (response.status_code, response.text) == (200, "whole")
            assert (await http.post("/v1/chat/completions", content=b"{}")).text == "whole"
        assert server.connections == 2  # not kept: it ended with its connection

    asyncio.run(run(to_the_close, check))


def test_a_waiter_cancelled_as_it_is_woken_passes_the_connection_on() -> None:
    from gateway.engine.transport import _Pool  # the pool itself: the race is between two of its waiters

    async def check(server: Scripted) -> None:
        pool = _Pool(httpx.URL(server.url), 1, None)
        request = httpx.Request("GET", server.url)
        held = await pool.acquire(request, 5.0)
        second = asyncio.ensure_future(pool.acquire(request, 5.0))
        third = asyncio.ensure_future(pool.acquire(request, 5.0))
        await asyncio.sleep(0.01)  # both wait for the one connection
        pool.release(held, reuse=True)  # wakes the second ...
        second.cancel()  # ... which is cancelled before it runs
        assert await asyncio.wait_for(third, 1.0) is held
        with pytest.raises(asyncio.CancelledError):
            await second
        pool.close()

    asyncio.run(run(keep_answering, check))
