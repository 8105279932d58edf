"""uvicorn's HTTP/1.1 protocol (httptools), with what one turn of the event loop writes sent as one write.

uvicorn writes a response's status line and headers, then its body, in two ``transport.write`` calls: two
``send`` syscalls for every answer, and a client that wakes for the head and again for the body. Here the
writes a connection makes during one pass of the event loop are held and sent together at the end of that
pass (``loop.call_soon``), so a response built in one go (every JSON answer) leaves in one segment; a
streamed response's chunks still leave as they are written, a pass later at most. Nothing is reordered: every
write of the connection goes through the same buffer, and closing the connection sends what it holds first.
(aiohttp's server, too, sends a response's headers with the first of its body.)
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _OnePassWrites:
    """A transport whose writes of one event-loop pass go out as one (the rest is the real transport's)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Hold ``data`` until the end of this pass of the event loop."""
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        """Hold each of ``lines``."""
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        """The real transport's buffer and what is held here."""
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def close(self) -> None:
        """Send what is held, then close (the real transport sends its buffer before it closes)."""
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        """Drop what is held and the connection."""
        self._held.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OnePassHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol over :class:`_OnePassWrites` (``uvicorn.Config(http=...)``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Serve the connection through a transport that sends each pass's writes as one."""
        one_pass: Any = _OnePassWrites(cast(asyncio.Transport, transport), self.loop)  # its stand-in
        super().connection_made(one_pass)
