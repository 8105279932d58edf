"""The engine client's HTTP/1.1 transport: httpx's client interface over aiohttp's connection pool.

httpx's own transport (httpcore, h11's state machine in Python, anyio's streams and cancel scopes) was the
largest block of the event loop's time per engine call; aiohttp parses the response in C and writes the
request with less machinery. :class:`~gateway.engine.client.EngineClient` keeps its ``httpx.AsyncClient``
(so a test's ``httpx.MockTransport`` replaces this transport as it replaced httpcore), and this transport
raises httpx's exceptions as httpcore did, so the client's retries and error mapping read them unchanged.

Not the ``httpx-aiohttp`` package's transport: it maps aiohttp's ``ServerDisconnectedError`` (the engine
closed the connection after it was sent the request) to ``httpx.ConnectTimeout``, which the client would
retry as a call the engine never saw.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import httpx

# httpcore's exception for each of aiohttp's, most specific first (the first match wins)
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),  # connecting, or waiting for a pooled connection
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),  # no byte within the read timeout
    (aiohttp.ClientConnectorError, httpx.ConnectError),  # refused, unreachable, unresolved: never sent
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),  # closed before or while answering
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),  # a body cut short or malformed
    (aiohttp.ClientError, httpx.ReadError),  # reset, broken pipe, and the rest of aiohttp's
)


@contextlib.contextmanager
def _as_httpx(request: httpx.Request) -> Iterator[None]:
    """aiohttp's errors raised as httpcore raised them (the original is the new one's cause)."""
    try:
        yield
    except aiohttp.ClientError as exc:
        mapped = next(to for from_, to in _ERRORS if isinstance(exc, from_))
        raise mapped(str(exc) or type(exc).__name__, request=request) from exc


class _Body(httpx.AsyncByteStream):
    """A response body as aiohttp receives it: each read's bytes as they come (a streamed line is never
    held back for a buffer to fill)."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx(self._request):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        # a body read to its end gives the connection back to the pool; one left unread closes it
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session for one engine: at most ``limits.max_connections`` connections, idle ones
    dropped after ``limits.keepalive_expiry`` (see ``ENGINE_KEEPALIVE_S``).

    The session is made on the first request (aiohttp wants a running event loop). Its own additions are
    off: no cookie jar, no decompression (httpx decodes as it did), the request's headers sent as httpx
    built them. One difference from httpcore: aiohttp sends an idempotent request (``GET /props``,
    ``/health``) once more when a pooled connection turns out closed; a ``POST`` never.
    """

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._limits.max_connections or 0,
            keepalive_timeout=self._limits.keepalive_expiry,
            ssl=httpx.create_ssl_context(),  # an https engine verified as httpx did (certifi, SSL_CERT_FILE)
        )
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        """httpx's timeouts of this request in aiohttp's terms (a few distinct ones, made once each):
        the pool wait and the connect under ``connect``, each read under ``sock_read``."""
        given = request.extensions.get("timeout", {})
        key = (given.get("pool"), given.get("connect"), given.get("read"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            pool, connect, read = key
            timeout = aiohttp.ClientTimeout(
                total=None, connect=None if pool is None or connect is None else pool + connect,
                sock_connect=connect, sock_read=read,
            )
            self._timeouts[key] = timeout
        return timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the response's body is read as the caller iterates it."""
        if self._session is None:
            self._session = self._open()
        content = await request.aread()
        with _as_httpx(request):
            response = await self._session.request(
                request.method,
                str(request.url),
                headers=[(name.decode("latin-1"), value.decode("latin-1"))  # as httpcore sent them, in case
                         for name, value in request.headers.raw],
                data=content or None,
                allow_redirects=False,
                timeout=self._timeout(request),
            )
        extensions = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            await self._session.close()
