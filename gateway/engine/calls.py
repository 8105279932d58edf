"""Every request an :class:`~gateway.engine.client.EngineClient` sends, counted once and timed.

The client's transport is wrapped: each request names its purpose (``verdict``, ``probe``, ``primer``,
``check``, ``tokenize``, ``props``, ``metrics``, ``health``, ``models``, ``decision``: a place of a
``POST /v1/decisions`` question's answer) in its extensions, carries an
``X-Request-Id`` (the request it serves, or one of its own), and is reported once, when its answer's body is
closed or it failed, with its outcome settled by what happened to the whole answer, not by its status line:
``ok`` (2xx, its body read to the end), ``busy`` (503 or 429: back-pressure), ``rejected`` (another 4xx),
``error`` (5xx, no answer, or a body cut short), ``timeout`` (a deadline passed before the end: httpx's, or
the client's own, which it names in the request's ``modgate.expired`` extension), ``cancelled`` (the caller
left, or the body was closed unread). A call the circuit refused before sending is reported by the client
as ``circuit_open`` (nothing reached the engine). The client may settle an answer itself (:func:`settle`):
a streamed verdict is whole at its ``[DONE]``, and a 200 whose stream ended early is an ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final, Literal

import httpx

from gateway.errors import UpstreamTimeout
from gateway.series.metrics import GatewayMetrics

Purpose = Literal[
    "verdict", "probe", "primer", "check", "tokenize", "props", "metrics", "health", "models", "decision",
]
PURPOSES: Final[tuple[Purpose, ...]] = (
    "verdict", "probe", "primer", "check", "tokenize", "props", "metrics", "health", "models", "decision",
)
PURPOSE_KEY: Final = "modgate.purpose"
"""The request extension that names an engine call's purpose."""
_SETTLE_KEY: Final = "modgate.settle"
"""The response extension through which the client settles a counted call's outcome (:func:`settle`)."""
Expired = Callable[[], bool]
EXPIRED_KEY: Final = "modgate.expired"
"""The request extension holding a ``() -> bool``: whether the client's own deadline (an asyncio timeout,
which cancels the task) has passed, so a cancellation is told apart as ``timeout`` or ``cancelled``."""

CallObserver = Callable[[str, str, str, float], None]
"""``(engine URL, purpose, outcome, seconds)``: one engine call, reported once."""


def outcome_of(status: int) -> str:
    """An answered call's outcome by its status."""
    if status < 400:
        return "ok"
    if status in (429, 503):
        return "busy"
    return "rejected" if status < 500 else "error"


def failure_outcome(exc: BaseException, expired: Expired | None) -> str:
    """The outcome of a call that ``exc`` ended: a deadline's ``timeout``, the caller's ``cancelled``, or
    ``error``."""
    if isinstance(exc, httpx.TimeoutException | TimeoutError | UpstreamTimeout):
        return "timeout"
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "timeout" if expired is not None and expired() else "cancelled"
    return "error"


class _TimedStream(httpx.AsyncByteStream):
    """An answer's body that reports its call once, when it is closed, with what happened to it: read to
    its end (the status's outcome), failed while read, or left unread (``cancelled``)."""

    def __init__(
        self, inner: httpx.AsyncByteStream, answered: str, expired: Expired | None,
        done: Callable[[str], None],
    ) -> None:
        self._inner = inner
        self._answered = answered  # the status line's outcome, which holds only if the body ends whole
        self._expired = expired
        self._outcome: str | None = None  # settled: by the body's end, its failure, or the client
        self._done: Callable[[str], None] | None = done

    def settle(self, outcome: str) -> None:
        """The client's word on the answer (it read a whole verdict, or found it cut short)."""
        self._outcome = outcome

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except BaseException as exc:
            if self._outcome is None:
                self._outcome = failure_outcome(exc, self._expired)
            raise
        if self._outcome is None:
            self._outcome = self._answered

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._done is not None:
                done, self._done = self._done, None
                done(self._outcome or "cancelled")


def settle(response: httpx.Response, outcome: str) -> None:
    """Settle a counted call's outcome before its body is closed (no-op for a response not counted here)."""
    settles = response.extensions.get(_SETTLE_KEY)
    if settles is not None:
        settles(outcome)


@contextlib.contextmanager
def settling(response: httpx.Response, expired: Expired | None) -> Iterator[None]:
    """Around the reading of an answer the client judges whole (a streamed verdict is, at its ``[DONE]``,
    though unread past it): ``ok`` when the block ends, what failed it when it raises. An error status's
    outcome stands (its body is read whole before the error is raised)."""
    try:
        yield
    except BaseException as exc:
        if response.status_code < 300:
            settle(response, failure_outcome(exc, expired))
        raise
    settle(response, "ok")


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
        expired = request.extensions.get(EXPIRED_KEY)
        started = time.perf_counter()
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as exc:
            self._report(purpose, failure_outcome(exc, expired), started)
            raise
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        timed = _TimedStream(
            stream, outcome_of(response.status_code), expired,
            lambda outcome: self._report(purpose, outcome, started),
        )
        response.stream = timed
        response.extensions[_SETTLE_KEY] = timed.settle  # httpx wraps the stream; the response keeps this
        return response

    def _report(self, purpose: str, outcome: str, started: float) -> None:
        if self.observe is not None:
            self.observe(self.engine, purpose, outcome, time.perf_counter() - started)

    async def aclose(self) -> None:
        await self.inner.aclose()


class CallFigures:
    """What the engine's calls cost, beyond their count and time (:class:`CountedTransport`): the slot wait,
    first token and tokens of a verdict call, its unusable outputs and failures, the engines' start-up checks
    and the failed reads of their ``/metrics``. The engine client's side counts them, here and nowhere else
    (a call is not a request: a request's figures go through gateway/telemetry/recorder.py)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def waited(self, seconds: float) -> None:
        """A verdict call's wait for an engine slot."""
        self.metrics.queue_wait.observe(seconds)

    def failed(self, kind: str) -> None:
        """A verdict call that failed, by the error's class name."""
        self.metrics.engine_errors.labels(kind).inc()

    def answered(self, ttft_s: float | None, prompt_tokens: int, cached_tokens: int) -> None:
        """A verdict call's answer: its time to first token (None: not streamed) and its tokens."""
        if ttft_s is not None:
            self.metrics.ttft.observe(ttft_s)
        self.tokens(prompt_tokens, cached_tokens)

    def tokens(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Prompt tokens sent and those the prefix cache served (a verdict call's, or a Decisions request's
        questions together)."""
        self.metrics.prompt_tokens.inc(prompt_tokens)
        self.metrics.cached_tokens.inc(cached_tokens)

    def unusable(self, problem: str) -> None:
        """An engine output that could not be used as a verdict, by its problem."""
        self.metrics.unparsable.labels(problem).inc()

    def checked(self, check: str, engine: str, ok: bool | None) -> None:
        """What the start-up check found on ``engine`` (None: the engine does not say, so no series)."""
        if ok is not None:
            self.metrics.engine_check.labels(check, engine).set(1.0 if ok else 0.0)

    def scrape_failed(self, kind: str) -> None:
        """A failed read of an engine's ``/metrics``, by why."""
        self.metrics.engine_scrape_errors.labels(kind).inc()
