"""The lines and JSON texts of an engine's streamed answer (server-sent events), read without a line limit."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec


def engine_json(data: bytes) -> Any:
    """A JSON text from the engine: msgspec (several times ``json.loads``'s speed on a stream chunk), or
    ``json.loads`` for what msgspec refuses and the standard parser took (``NaN``, ``-Infinity``, integers
    past 64 bits, invalid UTF-8 read with replacement): it reads all that it did before."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(data.decode(errors="replace"))


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The non-blank lines of a streamed body, without their ends (``\\n``, ``\\r\\n`` or ``\\r``).

    Of any length: a real vLLM SSE line (a chunk with its logprobs) can exceed 512 KiB, so a line is kept
    in parts until its end comes, never cut at a buffer size. Blank lines (SSE's event ends) are dropped.
    """
    parts: list[bytes] = []
    async for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line = b"".join((*parts, chunk[start:end])) if parts else chunk[start:end]
            parts.clear()
            start = end + 1
            if b"\r" in line:  # a "\r\n" end, or lines ended by a lone "\r" (as httpx splits them)
                for part in line.splitlines():
                    if part:
                        yield part
            elif line:
                yield line
        if start < len(chunk):
            parts.append(chunk[start:])
    for part in b"".join(parts).splitlines():
        if part:
            yield part
