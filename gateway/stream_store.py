"""The set-up the Redis stream stores share (jobs, review): the client, the consumer group, the scripts, the
replica wait and the 503 a Redis failure becomes; each store keeps its own keys, scripts and answers."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from gateway.state import run_replicated, unreachable_is_503


class RedisStreamStore:
    """A durable store on Redis streams read by one consumer group, its atomic steps as Lua scripts."""

    durable = True

    def __init__(
        self, client: aioredis.Redis, *, name: str, group: str, wait_replicas: int, wait_timeout_ms: int
    ) -> None:
        self._redis = client
        self._name = name  # "the job store": what a 503 says was unreachable
        self._group = group
        self.wait_replicas = wait_replicas  # replicas that must hold a write before it is answered as kept
        self.wait_timeout_ms = wait_timeout_ms

    def _script(self, source: str) -> AsyncScript:
        """``source`` registered once: run by its SHA, loaded again by redis-py if Redis forgot it."""
        return self._redis.register_script(source)

    def _unreachable(self, doing: str) -> AbstractAsyncContextManager[None]:
        """A Redis failure inside becomes a 503 ``state_unavailable``: cannot ``doing``, this store is out."""
        return unreachable_is_503(self._name, doing)

    async def _create_group(self, stream: str) -> None:
        """The consumer group on ``stream`` (made with the stream if need be), from its first entry; one made
        already (by another gateway, or before a restart) is kept as it is."""
        try:
            await self._redis.xgroup_create(stream, self._group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _run_replicated(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> tuple[Any, int]:
        """``script``'s answer, and how many of ``wait_replicas`` replicas held its writes within
        ``wait_timeout_ms`` (gateway/state.run_replicated; 0 replicas asked: no WAIT)."""
        return await run_replicated(self._redis, script, keys, args, self.wait_replicas, self.wait_timeout_ms)
