"""A connection's writes of one event-loop pass leave as one write (cli/http_protocol.py): a JSON answer's
head and body in one segment, streamed chunks as they come, nothing reordered or lost on close."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
from litestar import Litestar, get
from litestar.response import Stream

from cli.embedded import ThreadedServer
from cli.http_protocol import _OnePassWrites


class Recorded(asyncio.Transport):
    """What reached the socket, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


async def test_one_pass_of_writes_is_one_write_and_the_next_pass_another() -> None:
    real = Recorded()
    writes = _OnePassWrites(real, asyncio.get_running_loop())
    writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    writes.write(b"{}")
    assert real.writes == []
    assert writes.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    writes.writelines([b"a", b"b"])
    await asyncio.sleep(0)
    assert real.writes[1:] == [b"ab"]


async def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    real = Recorded()
    writes = _OnePassWrites(real, asyncio.get_running_loop())
    writes.write(b"last answer")
    writes.close()
    assert real.writes == [b"last answer"]
    assert real.closed
    await asyncio.sleep(0)
    assert real.writes == [b"last answer"]  # not sent twice

    dropped = Recorded()
    writes = _OnePassWrites(dropped, asyncio.get_running_loop())
    writes.write(b"never")
    writes.abort()
    await asyncio.sleep(0)
    assert dropped.writes == []
    assert dropped.aborted


async def test_writes_to_a_connection_that_closed_meanwhile_are_dropped() -> None:
    real = Recorded()
    writes = _OnePassWrites(real, asyncio.get_running_loop())
    writes.write(b"late")
    real.closed = True  # the peer went away before the pass ended
    await asyncio.sleep(0)
    assert real.writes == []


@get("/json")
async def json_answer() -> dict[str, str]:
    return {"answer": "x" * 100}


@get("/stream")
async def stream_answer() -> Stream:
    async def chunks() -> AsyncIterator[str]:
        for index in range(3):
            yield f"data: {index}\n\n"
            await asyncio.sleep(0.05)
    return Stream(chunks(), media_type="text/event-stream")


def test_served_answers_are_whole_kept_alive_streamed_and_closed() -> None:
    with ThreadedServer(Litestar([json_answer, stream_answer])) as server:
        with httpx.Client(base_url=server.url) as client:
            for _ in range(3):  # one kept-alive connection, answer after answer
                assert client.get("/json").json() == {"answer": "x" * 100}
            with client.stream("GET", "/stream") as response:
                assert list(response.iter_lines()) == ["data: 0", "", "data: 1", "", "data: 2", ""]
            closing = client.get("/json", headers={"Connection": "close"})
            assert closing.json() == {"answer": "x" * 100}
        # HTTP/1.1 pipelined on one socket: both answers, in order
        with socket.create_connection((server.host, server.port)) as raw:
            request = f"GET /json HTTP/1.1\r\nHost: {server.host}\r\n\r\n".encode()
            raw.sendall(request + request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            received = b""
            while chunk := raw.recv(65536):
                received += chunk
    assert received.count(b"HTTP/1.1 200 OK") == 2
    assert received.endswith(b'{"answer":"' + b"x" * 100 + b'"}')
