"""A Redis connection whose socket closed under it fails its next command with redis's ``ConnectionError``,
which every store and background loop handles, not uvloop's ``RuntimeError`` (real Redis, the uvloop the
gateway serves on).

CI's soak once ended with two replicas on different thinking-policy versions: one replica's policy follower
had died of "unable to perform operation on <TCPTransport closed=True>; the handler is closed" after a Redis
stall, and that replica served a stale policy until it stopped.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.policy.store import RedisPolicyStore
from gateway.state import SENTINEL_SCHEME, open_redis

pytestmark = pytest.mark.redis


def closed_under_it(writer: asyncio.StreamWriter) -> None:
    """What a cancelled disconnect or a peer's reset leaves: the socket closed, the connection unaware."""
    writer.transport.close()


def test_a_pubsub_whose_socket_closed_under_it_fails_with_a_connection_error_and_connects_again(
    redis_url: str,
) -> None:
    async def scenario() -> tuple[type[BaseException] | None, bool]:
        client = open_redis(redis_url, socket_timeout=5)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe("modgate:test:closed")
            assert pubsub.connection is not None
            closed_under_it(pubsub.connection._writer)  # type: ignore[arg-type]  # redis-py's own attribute
            await asyncio.sleep(0.05)
            raised: type[BaseException] | None = None
            try:
                await pubsub.subscribe("modgate:test:closed-again")
            except Exception as exc:  # which kind is what the test reads
                raised = type(exc)
            await pubsub.subscribe("modgate:test:closed-again")  # a new connection
            return raised, await client.ping()
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            await client.aclose()

    raised, answered = uvloop.run(scenario())
    assert raised is not None
    assert issubclass(raised, RedisConnectionError)
    assert answered


def test_a_command_on_a_pooled_connection_closed_under_it_fails_with_a_connection_error(
    redis_url: str,
) -> None:
    async def scenario() -> type[BaseException] | None:
        client = open_redis(redis_url, socket_timeout=5)
        try:
            await client.ping()
            connection = await client.connection_pool.get_connection()
            closed_under_it(connection._writer)  # type: ignore[arg-type]  # redis-py's own attribute
            await asyncio.sleep(0.05)
            try:
                await connection.send_command("PING")
            except Exception as exc:
                return type(exc)
            finally:
                await client.connection_pool.release(connection)
            return None
        finally:
            await client.aclose()

    raised = uvloop.run(scenario())
    assert raised is not None
    assert issubclass(raised, RedisConnectionError)


def test_the_policy_follower_lives_on_when_its_socket_closes_under_it(redis_url: str) -> None:
    """The follower's subscription socket closed under it, over and over: each flip still reaches it."""

    async def scenario() -> tuple[list[int], list[int], bool]:
        ours, theirs = open_redis(redis_url, socket_timeout=5), open_redis(redis_url, socket_timeout=5)
        follower = RedisPolicyStore(ours, key_prefix="test:closed", reload_interval_s=60,
                                    reconnect_interval_s=0.05)
        flipper = RedisPolicyStore(theirs, key_prefix="test:closed")
        seen, flipped = [], []
        try:
            await follower.start()
            await flipper.start()
            for turn in range(5):
                for connection in list(ours.connection_pool._in_use_connections):  # the subscription's
                    if connection._writer is not None:
                        closed_under_it(connection._writer)
                await asyncio.sleep(0.1)
                policy = flipper.current().model_copy(update={"default_mode": "on" if turn % 2 else "off"})
                wanted = (await flipper.replace(policy, "test", f"flip {turn}")).policy.version
                flipped.append(wanted)
                for _ in range(100):  # the flip is published, or found when the follower subscribes again
                    if follower.current().version == wanted:
                        break
                    await asyncio.sleep(0.05)
                seen.append(follower.current().version)
            return seen, flipped, follower._follower is not None and not follower._follower.done()
        finally:
            await follower.stop()
            await flipper.stop()
            await ours.aclose()
            await theirs.aclose()

    seen, flipped, following = uvloop.run(scenario())
    assert seen == flipped
    assert len(set(flipped)) == 5
    assert following


def test_behind_sentinel_the_primarys_connections_are_the_same_kind() -> None:
    client = open_redis(f"{SENTINEL_SCHEME}://127.0.0.1:26379/mymaster/0", socket_timeout=5)
    connection_class = client.connection_pool.connection_class
    plain = open_redis("redis://127.0.0.1:6379/0").connection_pool.connection_class
    assert [c.__name__ for c in connection_class.__mro__][:2] == ["_SentinelConnection", "_ClosedUnderIt"]
    assert [c.__name__ for c in plain.__mro__][:2] == ["_Connection", "_ClosedUnderIt"]
