"""Every request an :class:`~gateway.engine.client.EngineClient` sends, counted once and timed.

The client's transport is wrapped: each request names its purpose (``verdict``, ``probe``, ``primer``,
``check``, ``tokenize``, ``props``, ``metrics``, ``health``, ``models``, ``decision``: a place of a
``POST /v1/decisions`` question's answer) in its extensions, carries an
``X-Request-Id`` (the request it serves, or one of its own), and is reported once, when its answer's body is
closed or it failed, with its outcome: ``ok`` (2xx), ``busy`` (503 or 429: back-pressure), ``rejected``
(another 4xx), ``error`` (5xx, or no answer), ``timeout``. A call the circuit refused before sending is
reported by the client as ``circuit_open`` (nothing reached the engine).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Final, Literal

import httpx

Purpose = Literal[
    "verdict", "probe", "primer", "check", "tokenize", "props", "metrics", "health", "models", "decision",
]
PURPOSES: Final[tuple[Purpose, ...]] = (
    "verdict", "probe", "primer", "check", "tokenize", "props", "metrics", "health", "models", "decision",
)
PURPOSE_KEY: Final = "modgate.purpose"
"""The request extension that names an engine call's purpose."""

CallObserver = Callable[[str, str, str, float], None]
"""``(engine URL, purpose, outcome, seconds)``: one engine call, reported once."""


def outcome_of(status: int) -> str:
    """An answered call's outcome by its status."""
    if status < 400:
        return "ok"
    if status in (429, 503):
        return "busy"
    return "rejected" if status < 500 else "error"


class _TimedStream(httpx.AsyncByteStream):
    """An answer's body that reports its call when it is closed (a streamed verdict: at its end)."""

    def __init__(self, inner: httpx.AsyncByteStream, done: Callable[[], None]) -> None:
        self._inner = inner
        self._done: Callable[[], None] | None = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._done is not None:
                done, self._done = self._done, None
                done()


class CountedTransport(httpx.AsyncBaseTransport):
    """The engine client's transport, reporting each request it sends to ``observe`` (when set)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, engine: str) -> None:
        self.inner = inner
        self.engine = engine
        self.observe: CallObserver | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        purpose = str(request.extensions.get(PURPOSE_KEY, "verdict"))
        if "x-request-id" not in request.headers:
            request.headers["X-Request-Id"] = f"modgate-{purpose}-{uuid.uuid4().hex[:16]}"
        started = time.perf_counter()
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TimeoutException:
            self._report(purpose, "timeout", started)
            raise
        except BaseException:
            self._report(purpose, "error", started)
            raise
        outcome = outcome_of(response.status_code)
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _TimedStream(stream, lambda: self._report(purpose, outcome, started))
        return response

    def _report(self, purpose: str, outcome: str, started: float) -> None:
        if self.observe is not None:
            self.observe(self.engine, purpose, outcome, time.perf_counter() - started)

    async def aclose(self) -> None:
        await self.inner.aclose()
