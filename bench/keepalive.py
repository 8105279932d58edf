"""A lean HTTP/1.1 keep-alive client for load generation on loopback.

The benchmarks share two cores with the servers they measure, so the load generator must cost as little as
possible: httpx spends about as much CPU per request as the engine stub it talks to, and at 64 clients its
connection pool becomes the bottleneck (the direct-to-engine arm fell to ~100 requests/s). Each client here
owns one connection and posts pre-encoded request bytes; it reads the status, the headers and the whole
body (``Content-Length`` or chunked), like a real caller, and nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Reply:
    """A response: status and whole body."""

    status: int
    body: bytes


def encode_request(url: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A ``POST`` with a JSON body, as bytes on the wire."""
    parts = urlsplit(url)
    lines = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class KeepAliveConnection:
    """One connection, reused request after request (reopened if the server closes it)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> Reply:
        """Send one encoded request and read its whole response.

        A kept-alive connection the server closed while idle (its keep-alive timeout) is reopened and the
        request sent again, as HTTP clients do: nothing of it was answered.
        """
        reused = self._writer is not None
        if self._writer is None or self._reader is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        reader, writer = self._reader, self._writer
        try:
            writer.write(raw)
            status_line = await reader.readline()
        except ConnectionError:
            status_line = b""
        if not status_line:
            await self.close()
            if reused:
                return await self.request(raw)
            raise ConnectionError("the server closed the connection without answering")
        status = int(status_line.split(b" ", 2)[1])
        length: int | None = None
        chunked, keep_alive = False, True
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                keep_alive = False
        if chunked:
            body = await self._read_chunked(reader)
        elif length is not None:
            body = await reader.readexactly(length)
        else:
            body = await reader.read()
            keep_alive = False
        if not keep_alive:
            await self.close()
        return Reply(status, body)

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        chunks: list[bytes] = []
        while True:
            size = int((await reader.readline()).split(b";", 1)[0], 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b""):  # trailers
                    pass
                return b"".join(chunks)
            chunks.append((await reader.readexactly(size + 2))[:-2])

    async def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None
