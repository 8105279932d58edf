"""The engine client's HTTP/1.1 transport: httpx's client interface over a connection pool of its own.

httpx's own transport (httpcore, h11's state machine in Python, anyio's streams and cancel scopes) and then
aiohttp's client (its request and response objects, URL parsing, timers, payload writers) were each the
largest block of the event loop's time per engine call. Here a connection is an ``asyncio.Protocol`` whose
responses httptools (llhttp, in C) parses; a request is its head and body written at once. It speaks just
what an engine needs: HTTP/1.1 with keep-alive, bodies sized or chunked, TLS for an ``https`` engine.
:class:`~gateway.engine.client.EngineClient` keeps its ``httpx.AsyncClient`` (so a test's
``httpx.MockTransport`` replaces this transport as it replaced httpcore), and errors are raised as httpx's
own, as httpcore raised them, so the client's retries and error mapping read them unchanged:

- refused, unreachable, unresolved: ``ConnectError`` (the engine never saw the request: retried);
- no connection within the pool wait plus the connect timeout: ``ConnectTimeout``;
- no byte within the read timeout, waiting for the answer or inside it: ``ReadTimeout``;
- closed before or while answering, or an answer that is not HTTP: ``RemoteProtocolError``;
- reset and the other socket errors while reading: ``ReadError``.

A pooled connection that the engine closes while idle is never used again; one idle past
``limits.keepalive_expiry`` is closed instead of used (see ``ENGINE_KEEPALIVE_S``). A request whose pooled
connection turns out closed before a byte of the answer came is sent again on a new one only if it is a
``GET`` or ``HEAD``; a ``POST`` never (the engine may have taken it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import cast

import httptools
import httpx

_HIGH_WATER = 1 << 20  # bytes of an answer held unread before the socket stops being read (until taken)
_IDEMPOTENT = frozenset({"GET", "HEAD"})


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: answers parsed as they arrive, their body held until it is read."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.dropped = False  # counted out of the pool's open connections (once)
        self.used = False  # has carried a request before this one
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._begin()

    def _begin(self) -> None:
        """Ready for the next answer."""
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head = False  # the answer's head came
        self.complete = False  # its body came to its end
        self.keep_alive = False
        self.delimited = True  # its body's end is said (a length, chunks), not the connection's close
        self.received = False  # any byte of it came
        self.error: httpx.TransportError | None = None
        self.timed_out = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, not by inheritance

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the engine's answer is not HTTP/1.1: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport: the connection is of no more use

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is None and self.head and not self.delimited and not self.complete:
            self.complete = True  # a body that runs to the close ends there (HTTP/1.1, section 6.3)
            self._wake()
        if not self.complete and self.error is None:
            if exc is None:
                said = "before answering" if not self.received else "before the answer was complete"
                self._fail(httpx.RemoteProtocolError(f"the engine closed the connection {said}"))
            else:
                self._fail(httpx.ReadError(f"the engine connection failed: {exc!r}"))
        self.pool.lost(self)

    # httptools' callbacks

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.delimited = self.status in (204, 304) or any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers
        )
        self.head = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # the reading side

    def _fail(self, error: httpx.TransportError) -> None:
        self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _time_out(self) -> None:
        self.timed_out = True
        self._wake()

    async def wait(self, read_timeout: float | None, request: httpx.Request) -> None:
        """Until more of the answer (or its end, or an error) comes; ``ReadTimeout`` past ``read_timeout``."""
        if self.error is None:
            waiter = self._waiter = self.loop.create_future()
            timer = None if read_timeout is None else self.loop.call_later(read_timeout, self._time_out)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if self.error is not None:
            raise self.error
        if self.timed_out:
            raise httpx.ReadTimeout(f"no byte from the engine within {read_timeout:g} s", request=request)

    def take(self) -> bytes:
        """What of the body has come and is unread."""
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def reusable(self, now: float, expiry: float | None) -> bool:
        """Whether this idle connection may carry another request."""
        return not self.lost and (expiry is None or now - self.idle_since < expiry)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; read to its end, its connection goes back to the pool."""

    def __init__(self, pool: _Pool, connection: _Connection, request: httpx.Request, read: float | None):
        self._pool = pool
        self._connection: _Connection | None = connection
        self._request = request
        self._read = read

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        while True:
            if connection.chunks:
                yield connection.take()
            elif connection.complete:
                break
            elif connection.error is not None:
                raise connection.error
            else:
                await connection.wait(self._read, self._request)
        self._release(reuse=True)

    def _release(self, *, reuse: bool) -> None:
        """Give the connection back: pooled again only if ``reuse`` and its answer ended with keep-alive."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, reuse=reuse and connection.complete and connection.keep_alive)

    async def aclose(self) -> None:
        # a body read to its end gives the connection back; one left unread closes it
        connection = self._connection
        if connection is not None:
            self._release(reuse=not connection.chunks)


class _Pool:
    """The connections to one engine: at most ``limit`` open, idle ones reused newest first."""

    def __init__(self, url: httpx.URL, limit: int | None, expiry: float | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = httpx.create_ssl_context() if url.scheme == "https" else None  # verified as httpx did
        self.limit = limit
        self.expiry = expiry
        self.idle: list[_Connection] = []
        self.open = 0
        self.closed = False  # the transport was closed: connections given back are closed, not pooled
        self.waiters: deque[asyncio.Future[None]] = deque()

    def idle_connection(self) -> _Connection | None:
        """A pooled connection still fit to use (the unfit ones closed on the way)."""
        now = time.monotonic()
        while self.idle:
            connection = self.idle.pop()
            if connection.reusable(now, self.expiry):
                return connection
            self._drop(connection)
        return None

    async def acquire(self, request: httpx.Request, within: float | None) -> _Connection:
        """A connection for ``request``: an idle one, a new one, or the next one given back (waiting for one
        and connecting take at most ``within`` seconds together)."""
        connection = self.idle_connection()
        if connection is not None:
            return connection
        try:
            async with asyncio.timeout(within):
                while self.limit and self.open >= self.limit:
                    waiter = self.loop.create_future()
                    self.waiters.append(waiter)
                    try:
                        await waiter
                    except BaseException:
                        if waiter.done() and not waiter.cancelled():
                            self._wake_one()  # woken, then cancelled: the wake goes to the next in line
                        raise
                    finally:
                        if waiter in self.waiters:
                            self.waiters.remove(waiter)
                    connection = self.idle_connection()
                    if connection is not None:
                        return connection
                self.open += 1
                try:
                    return await self._connect()
                except BaseException:
                    self.open -= 1
                    self._wake_one()
                    raise
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(
                f"no connection to the engine within {within:g} s", request=request
            ) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc

    async def _connect(self) -> _Connection:
        made = _Connection(self)
        if self.tls is None:
            await self.loop.create_connection(lambda: made, self.host, self.port)
        else:
            await self.loop.create_connection(
                lambda: made, self.host, self.port, ssl=self.tls, server_hostname=self.host
            )
        return made

    def release(self, connection: _Connection, *, reuse: bool) -> None:
        """A connection back from an answer: pooled for the next request, or closed."""
        if reuse and not connection.lost and not self.closed:
            connection._begin()
            connection.idle_since = time.monotonic()
            self.idle.append(connection)
            self._wake_one()
        else:
            self._drop(connection)

    def lost(self, connection: _Connection) -> None:
        """The peer closed ``connection``: an idle one leaves the pool now."""
        if connection in self.idle:
            self.idle.remove(connection)
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        connection.close()
        if not connection.dropped:
            connection.dropped = True
            self.open -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        """Close the idle connections; those in use close when their answers are read."""
        self.closed = True
        for connection in self.idle:
            connection.close()
        self.idle.clear()


class EngineTransport(httpx.AsyncBaseTransport):
    """At most ``limits.max_connections`` connections to one engine, idle ones dropped after
    ``limits.keepalive_expiry``. The pool is made on the first request (it wants a running event loop)."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._pools: dict[tuple[bytes, bytes, int | None], _Pool] = {}

    def _pool(self, url: httpx.URL) -> _Pool:
        key = (url.raw_scheme, url.raw_host, url.port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(url, self._limits.max_connections, self._limits.keepalive_expiry)
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the response's body is read as the caller iterates it."""
        pool = self._pool(request.url)
        given = request.extensions.get("timeout", {})
        pool_wait, connect, read = given.get("pool"), given.get("connect"), given.get("read")
        wait = None if pool_wait is None or connect is None else pool_wait + connect
        content = await request.aread()
        head = b"".join((
            request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n",
            *(b"%s: %s\r\n" % pair for pair in request.headers.raw), b"\r\n",
        ))
        for attempt in range(2):
            connection = await pool.acquire(request, wait)
            reused = connection.used
            connection.used = True
            assert connection.transport is not None
            connection.transport.writelines((head, content) if content else (head,))
            try:
                while not connection.head:
                    await connection.wait(read, request)
            except httpx.TransportError as exc:
                pool.release(connection, reuse=False)
                if (attempt == 0 and reused and not connection.received and request.method in _IDEMPOTENT
                        and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)):
                    continue  # a kept-alive connection the engine had closed: a GET is asked again
                exc.request = request
                raise
            except BaseException:
                pool.release(connection, reuse=False)
                raise
            break
        extensions: dict[str, object] = {"http_version": b"HTTP/1.1"}
        if connection.reason:
            extensions["reason_phrase"] = connection.reason
        response = httpx.Response(
            connection.status,
            headers=connection.headers,
            stream=_Body(pool, connection, request, read),
            request=request,
            extensions=extensions,
        )
        if request.method == "HEAD":  # no body follows, whatever its head says: the parser would wait for one
            connection.complete, connection.keep_alive = True, False
        return response

    async def aclose(self) -> None:
        """Close the pools' connections."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
