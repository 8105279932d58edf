"""The shared state's address: one Redis server, or a primary found through Redis Sentinel.

``MODGATE_REDIS__URL`` takes redis-py's URLs (``redis://``, ``rediss://``, ``unix://``) or
``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT…]/SERVICE[/DB]``: the sentinels to ask, the name they
monitor the primary under, and the database. With Sentinel, every new connection asks a sentinel where the
primary is now, so after a failover the client reconnects to the promoted replica by itself; a connection
still open to the old primary fails (and a demoted primary's ``READONLY`` answer closes it), the call that
met it fails fast like any Redis failure, and the next one goes to the new primary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.errors import StateUnavailable

SENTINEL_SCHEME = "redis+sentinel"
PLAIN_SCHEMES = ("redis", "rediss", "unix")
# How long the service's Redis client waits for an answer (gateway/http/services.redis_client): a replicas'
# WAIT must end inside it (the jobs' and review items' wait_timeout_ms stop at 4,000), else it reads as
# "Redis unreachable" rather than "too few replicas".
SOCKET_TIMEOUT_S = 5.0


class RedisUrlError(ValueError):
    """``MODGATE_REDIS__URL`` is not a Redis or Sentinel URL modgate can use."""


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The sentinels, service and database of a ``redis+sentinel://`` URL (:class:`RedisUrlError` if bad)."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise RedisUrlError(f"not a {SENTINEL_SCHEME}:// URL: {url!r}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) or None if userinfo else None
    sentinels = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise RedisUrlError(f"{SENTINEL_SCHEME}:// needs HOST:PORT[,HOST:PORT…], got {item!r}")
        sentinels.append((host.strip("[]"), int(port)))
    path = [segment for segment in parts.path.split("/") if segment]
    if not 1 <= len(path) <= 2 or (len(path) == 2 and not path[1].isdigit()):
        raise RedisUrlError(
            f"{SENTINEL_SCHEME}:// needs /SERVICE[/DB] after the sentinels, got {parts.path!r}"
        )
    return SentinelTarget(tuple(sentinels), path[0], int(path[1]) if len(path) == 2 else 0, password)


def check_redis_url(url: str) -> None:
    """Raise :class:`RedisUrlError` unless ``url`` is one of the accepted forms."""
    scheme = urlsplit(url).scheme
    if scheme == SENTINEL_SCHEME:
        parse_sentinel_url(url)
    elif scheme not in PLAIN_SCHEMES:
        raise RedisUrlError(
            f"MODGATE_REDIS__URL must start with redis://, rediss://, unix:// or {SENTINEL_SCHEME}://, "
            f"got {url!r}"
        )


class _ClosedUnderIt:
    """A connection whose socket closed under it (the server went away, a failover) fails its next command
    with redis's ``ConnectionError``, as every store handles, not uvloop's ``RuntimeError`` ("unable to
    perform operation on <TCPTransport closed=True>; the handler is closed"), which redis-py passes on as it
    is: a background loop that survives Redis errors (the policy follower, lease renewals) died of it, and a
    replica then served a stale policy for good. redis-py has already dropped the connection when this
    runs; the next command connects anew."""

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]  # the mixin's partner
        except RuntimeError as exc:
            raise RedisConnectionError(f"the connection to Redis closed under the command ({exc})") from exc

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]  # the mixin's partner
        except RuntimeError as exc:
            raise RedisConnectionError(f"the connection to Redis closed under the command ({exc})") from exc


class _Connection(_ClosedUnderIt, aioredis.Connection):
    """A plain server's connection (``redis://``)."""


class _SentinelConnection(_ClosedUnderIt, SentinelManagedConnection):
    """The primary's connection, found through Sentinel."""


class _PrimaryBehindSentinel(aioredis.Redis):
    """The primary's client; closing it also closes the connections to the sentinels."""

    sentinel_manager: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the pool, then the sentinel clients."""
        await super().aclose(close_connection_pool)
        if self.sentinel_manager is not None:
            for client in self.sentinel_manager.sentinels:
                await client.aclose()


def open_redis(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client for ``url``: ``options`` (timeouts, retry, ...) apply to the data connections, and
    the socket timeouts also to the sentinels'."""
    check_redis_url(url)
    scheme = urlsplit(url).scheme
    if scheme == "redis":
        return aioredis.Redis.from_url(url, connection_class=_Connection, **options)
    if scheme != SENTINEL_SCHEME:  # TLS or a Unix socket: redis-py's own connection for it
        return aioredis.Redis.from_url(url, **options)
    target = parse_sentinel_url(url)
    sockets = {name: value for name, value in options.items() if name.startswith("socket_")}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves Sentinel's __init__ untyped
        list(target.sentinels), sentinel_kwargs=sockets
    )
    client = sentinel.master_for(
        target.service, redis_class=_PrimaryBehindSentinel, connection_class=_SentinelConnection,
        db=target.db, password=target.password, **options,
    )
    assert isinstance(client, _PrimaryBehindSentinel)
    client.sentinel_manager = sentinel
    return client


async def run_replicated(
    client: aioredis.Redis, script: Any, keys: list[Any], args: list[Any], replicas: int, timeout_ms: int
) -> tuple[Any, int]:
    """Run a registered Lua ``script``, then ``WAIT`` for ``replicas`` replicas to hold its writes, on one
    connection (WAIT counts that connection's writes): the script's answer and how many replicas held them
    in ``timeout_ms``. Redis replicates asynchronously, so what the primary acknowledged is lost if it fails
    before a replica has it; ``replicas`` 0 runs the script alone (and answers 0)."""
    if replicas <= 0:
        return await script(keys=keys, args=args), 0
    async with client.pipeline(transaction=False) as pipe:
        await script(keys=keys, args=args, client=pipe)
        pipe.wait(replicas, timeout_ms)
        answer, holding = await pipe.execute()
    return answer, int(holding)


@asynccontextmanager
async def unreachable_is_503(store: str, doing: str) -> AsyncIterator[None]:
    """A Redis failure inside becomes a 503 the caller can retry (``state_unavailable``), saying what could
    not be done and which store (``"the job store"``) was unreachable."""
    try:
        yield
    except RedisError as exc:
        unreachable = f"{store} (Redis) is unreachable ({type(exc).__name__})"
        raise StateUnavailable(f"cannot {doing}: {unreachable}") from exc
