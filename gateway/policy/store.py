"""Where the thinking policy lives: one process's memory, or Redis shared by every replica.

Redis layout (``<prefix>`` is ``MODGATE_POLICY__KEY_PREFIX``):
- ``<prefix>`` hash: ``version`` and ``document`` (the policy JSON), written together.
- ``<prefix>:history`` hash: version → document, for rollback and ``modgate policy history``.
- ``<prefix>:audit`` list: audit entries (JSON), newest first, trimmed to ``audit_max_entries``.
- ``<prefix>:changed`` pub/sub channel: the new version, published in the same transaction as the flip.

Serving never waits on Redis: each replica answers from the last document it read, follows the channel
to apply a flip within a second, and re-reads every ``reload_interval_s`` in case a message was lost.
While Redis is unreachable the replica keeps its last policy and refuses flips (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.errors import Conflict, NotFound, StateUnavailable
from gateway.policy.rules import AuditEntry, PolicyUpdate, StoreStatus, ThinkingPolicy, policy_changes
from gateway.tasks import stop

log = logging.getLogger("modgate.policy")
T = TypeVar("T")

# A change applied to the document in force gives the next document and its audit entry, or None when it
# would change nothing (no new version, nothing audited).
Proposal = tuple[ThinkingPolicy, AuditEntry] | None
Change = Callable[[ThinkingPolicy], Proposal]
# In Redis a change may also need earlier documents from the history (by version).
RedisChange = Callable[[ThinkingPolicy, dict[int, ThinkingPolicy]], Proposal]

# An edit of the document in force (one part of it, e.g. the moderation policy): applied to whatever is in
# force where the flip lands, so a part edited on one replica never reverts another part flipped elsewhere.
Edit = Callable[[ThinkingPolicy], ThinkingPolicy]

MAX_HISTORY_VERSIONS = 1000


def next_version(
    current: ThinkingPolicy, content: ThinkingPolicy, actor: str, reason: str, action: str = "set"
) -> Proposal:
    """``content`` as the version after ``current``, with its audit entry; None when it decides alike."""
    if content.content_hash() == current.content_hash():
        return None
    now = datetime.now(UTC)
    new = content.model_copy(
        update={"version": current.version + 1, "updated_at": now, "updated_by": actor, "reason": reason}
    )
    entry = AuditEntry(
        at=now, actor=actor, action="rollback" if action == "rollback" else "set", reason=reason,
        old_version=current.version, new_version=new.version, old_hash=current.content_hash(),
        new_hash=new.content_hash(), changes=policy_changes(current, new),
    )
    return new, entry


def _replace_with(content: ThinkingPolicy, actor: str, reason: str, expected_version: int | None) -> Change:
    return _amend_with(lambda _: content, actor, reason, expected_version)


def _amend_with(edit: Edit, actor: str, reason: str, expected_version: int | None) -> Change:
    def change(current: ThinkingPolicy) -> Proposal:
        if expected_version is not None and expected_version != current.version:
            raise Conflict(
                f"the policy was edited from version {expected_version}, but version {current.version} is "
                "now in force: read it again and re-apply your change",
                code="stale_policy_version", param="version",
            )
        return next_version(current, edit(current), actor, reason)

    return change


def _rollback_target(current: ThinkingPolicy, to_version: int | None) -> int:
    target = current.version - 1 if to_version is None else to_version
    if target < 1 or target >= current.version:
        raise NotFound(f"no earlier version {target} to roll back to (version {current.version} is in force)",
                       code="no_such_policy_version", param="to_version")
    return target


class MemoryPolicyStore:
    """One process's policy, history and audit trail, in memory (``MODGATE_REDIS__URL`` unset)."""

    def __init__(self, initial: ThinkingPolicy | None = None) -> None:
        self._policy = initial or ThinkingPolicy()
        self._history: dict[int, ThinkingPolicy] = {self._policy.version: self._policy}
        self._audit: list[AuditEntry] = []

    def current(self) -> ThinkingPolicy:
        """The policy in force."""
        return self._policy

    def status(self) -> StoreStatus:
        """Always available; never shared with another replica."""
        return StoreStatus(backend="memory", available=True,
                           detail="this process only (MODGATE_REDIS__URL unset)")

    def _apply(self, change: Change) -> PolicyUpdate:
        # No await between reading and writing: one event loop makes this atomic.
        result = change(self._policy)
        if result is None:
            return PolicyUpdate(self._policy, changed=False)
        new, entry = result
        self._policy = new
        self._history[new.version] = new
        self._audit.insert(0, entry)
        return PolicyUpdate(new, changed=True)

    async def replace(
        self, policy: ThinkingPolicy, actor: str, reason: str, expected_version: int | None = None
    ) -> PolicyUpdate:
        """Install a new document under the next version."""
        return self._apply(_replace_with(policy, actor, reason, expected_version))

    async def amend(
        self, edit: Edit, actor: str, reason: str, expected_version: int | None = None
    ) -> PolicyUpdate:
        """Install ``edit(document in force)`` under the next version."""
        return self._apply(_amend_with(edit, actor, reason, expected_version))

    async def rollback(self, to_version: int | None, actor: str, reason: str) -> PolicyUpdate:
        """Install an earlier version's content under the next version."""
        target = _rollback_target(self._policy, to_version)
        if target not in self._history:
            raise NotFound(f"version {target} is not in the history", code="no_such_policy_version",
                           param="to_version")
        earlier = self._history[target]
        return self._apply(lambda current: next_version(current, earlier, actor, reason, action="rollback"))

    async def history(self, limit: int) -> list[ThinkingPolicy]:
        """Documents, newest first."""
        return [self._history[v] for v in sorted(self._history, reverse=True)[:limit]]

    async def audit(self, limit: int) -> list[AuditEntry]:
        """The audit trail, newest first."""
        return self._audit[:limit]

    async def start(self) -> None:
        """Nothing to load."""

    async def stop(self) -> None:
        """Nothing to close."""


# Re-seed the shared document when Redis holds none (a restart without persistence) or an older one than
# this replica knows: a Redis that lost its data must not silently revert a flip to the built-in default.
_SEED_IF_OLDER = """
local stored = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if stored >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'document', ARGV[2])
redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
redis.call('LPUSH', KEYS[3], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[1])
return 1
"""

_REDIS_DOWN = (RedisError, OSError, TimeoutError)


def _stored_version(raw: str | bytes | None) -> int:
    """The ``version`` field of the stored hash (0 when there is none)."""
    return int(raw) if raw is not None and raw.isdigit() else 0


class RedisPolicyStore:
    """The policy shared through Redis: a document, its history, an audit list and a change channel."""

    def __init__(
        self,
        client: Redis,
        *,
        key_prefix: str = "modgate:thinking-policy",
        reload_interval_s: float = 5.0,
        timeout_s: float = 1.0,
        reconnect_interval_s: float = 0.5,
        audit_max_entries: int = 10000,
    ) -> None:
        # The service's one Redis client (gateway/http/services.py), which retries nothing: a flip against a
        # dead Redis must answer 503 at once, and the follower task does its own reconnecting. Its socket
        # timeouts are the service's, longer than a flip may wait, so each round trip here has ``timeout_s``
        # (:meth:`_ask`) and each operation three times that (:meth:`_deadline`).
        self._redis = client
        self._key = key_prefix
        self._history_key = f"{key_prefix}:history"
        self._audit_key = f"{key_prefix}:audit"
        self._channel = f"{key_prefix}:changed"
        self._reload_interval_s = reload_interval_s
        self._timeout_s = timeout_s
        self._reconnect_interval_s = reconnect_interval_s
        self._audit_max_entries = audit_max_entries
        self._seed = self._redis.register_script(_SEED_IF_OLDER)
        self._replica = f"{socket.gethostname()}:{os.getpid()}"
        self._policy = ThinkingPolicy()
        self._available = False
        self._last_sync_at: datetime | None = None
        self._detail: str | None = "not started"
        self._follower: asyncio.Task[None] | None = None
        self._stopping = False

    def current(self) -> ThinkingPolicy:
        """The last document this replica read (or wrote): serving never waits on Redis."""
        return self._policy

    def status(self) -> StoreStatus:
        """Backend, availability and last sync."""
        return StoreStatus(backend="redis", available=self._available, last_sync_at=self._last_sync_at,
                           detail=self._detail)

    def _deadline(self) -> asyncio.Timeout:
        """How long one operation (a few round trips) may wait on Redis."""
        return asyncio.timeout(self._timeout_s * 3)

    async def _ask(self, call: Awaitable[T]) -> T:
        """One round trip to Redis, given ``timeout_s``: a Redis that hangs fails it as a dead one would."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except TimeoutError as exc:
            raise RedisTimeoutError(f"Redis did not answer within {self._timeout_s:g} s") from exc

    # --- following the shared document ---

    async def start(self) -> None:
        """Read (or seed) the shared document, then follow changes; a dead Redis is logged, not fatal."""
        try:
            async with self._deadline():
                await self.sync()
        except _REDIS_DOWN as exc:
            self._mark_down(exc)
        self._follower = asyncio.create_task(self._follow(), name="thinking-policy-follower")

    async def stop(self) -> None:
        """Stop following (the client is the service's: it closes it)."""
        # The flag as well as the cancel: Python 3.11's asyncio.timeout (inside redis-py) can turn a cancel
        # that lands as its deadline passes into a TimeoutError, which the follower would take for Redis down.
        self._stopping = True
        await stop(self._follower)

    async def sync(self) -> ThinkingPolicy:
        """Read the shared document and install it; seed it when Redis holds none or an older one."""
        version, document = await self._ask(self._redis.hmget(self._key, ["version", "document"]))
        stored = self._parse(document)
        stored_version = _stored_version(version)
        if stored is None and document is not None:
            self._mark_synced()  # a document we cannot read: keep ours, leave it for an operator to fix
            return self._policy
        if stored is None or stored_version < self._policy.version:
            await self._seed_from_here(stored)
        elif stored.version != self._policy.version or stored.content_hash() != self._policy.content_hash():
            self._install(stored)
        self._mark_synced()
        return self._policy

    async def _seed_from_here(self, stored: ThinkingPolicy | None) -> None:
        ours = self._policy
        reason = ("Redis held no thinking policy" if stored is None
                  else f"Redis held version {stored.version}, older than this replica's")
        entry = AuditEntry(
            at=datetime.now(UTC), actor=f"replica:{self._replica}", action="seed",
            reason=f"{reason}: seeded with version {ours.version}",
            old_version=stored.version if stored else None, new_version=ours.version,
            old_hash=stored.content_hash() if stored else None, new_hash=ours.content_hash(),
            changes=policy_changes(stored, ours) if stored else {},
        )
        keys = [self._key, self._history_key, self._audit_key]
        args: list[str | int] = [ours.version, ours.model_dump_json(), entry.model_dump_json(), self._channel]
        if await self._ask(self._seed(keys=keys, args=args)):
            log.warning("%s: seeded it with version %d (default_mode %s)",
                        reason, ours.version, ours.default_mode)
        else:  # another replica seeded first: take what it wrote
            _, document = await self._ask(self._redis.hmget(self._key, ["version", "document"]))
            seeded = self._parse(document)
            if seeded is not None:
                self._install(seeded)

    async def _follow(self) -> None:
        """Apply flips published on the channel; re-read periodically; reconnect while Redis is away."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                async with self._deadline():
                    await self._ask(pubsub.subscribe(self._channel))
                    await self.sync()  # catch up on whatever changed while we were not subscribed
                next_reload = loop.time() + self._reload_interval_s
                while not self._stopping:
                    wait_s = min(1.0, max(0.0, next_reload - loop.time()))
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait_s)
                    if message is not None or loop.time() >= next_reload:
                        async with self._deadline():
                            await self.sync()
                        next_reload = loop.time() + self._reload_interval_s
            except _REDIS_DOWN as exc:
                if not self._stopping:
                    self._mark_down(exc)
            except Exception as exc:  # a dead follower would leave this replica on a stale policy for good
                if not self._stopping:
                    log.exception("policy store: following Redis failed unexpectedly; subscribing again")
                    self._mark_down(exc)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            if not self._stopping:
                await asyncio.sleep(self._reconnect_interval_s)

    def _parse(self, document: str | bytes | None) -> ThinkingPolicy | None:
        if document is None:
            return None
        try:
            return ThinkingPolicy.model_validate_json(document)
        except ValidationError as exc:
            log.error("the thinking policy stored in Redis is not valid (keeping version %d): %s",
                      self._policy.version, exc)
            return None

    def _install(self, policy: ThinkingPolicy) -> None:
        previous = self._policy
        self._policy = policy
        if policy.version != previous.version:
            log.info("thinking policy version %d in force (default_mode %s, by %s: %s)",
                     policy.version, policy.default_mode, policy.updated_by, policy.reason)

    def _mark_synced(self) -> None:
        if not self._available:
            level = logging.INFO if self._detail == "not started" else logging.WARNING  # louder: recovered
            log.log(level, "policy store: Redis at %s answers; thinking policy version %d in force",
                    self._redis_where(), self._policy.version)
        self._available = True
        self._detail = None
        self._last_sync_at = datetime.now(UTC)

    def _mark_down(self, exc: BaseException) -> None:
        if self._available or self._detail == "not started":
            log.error(
                "policy store: Redis at %s is unreachable (%s): serving thinking policy version %d from "
                "memory; flips are refused until it answers", self._redis_where(), exc or type(exc).__name__,
                self._policy.version,
            )
        self._available = False
        self._detail = f"Redis unreachable: {exc or type(exc).__name__}"

    def _redis_where(self) -> str:
        kwargs = self._redis.connection_pool.connection_kwargs
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"

    def _unavailable(self, exc: BaseException, doing: str) -> StateUnavailable:
        self._mark_down(exc)
        return StateUnavailable(
            f"the policy store (Redis) is unreachable, so {doing} was refused; this replica keeps serving "
            f"thinking policy version {self._policy.version}. Try again once Redis answers.",
            code="policy_store_unavailable",
        )

    # --- changing the shared document ---

    async def _transact(self, change: RedisChange, wants: int | None = None,
                        expected_version: int | None = None) -> PolicyUpdate:
        """Apply a change atomically: WATCH the document, compute, MULTI/EXEC; retry if another flip won.

        ``wants`` names an earlier version the change needs (a rollback's target), read from the history.
        """
        for _ in range(5):
            async with self._redis.pipeline(transaction=True) as pipe:
                await self._ask(pipe.watch(self._key))
                version, document = await self._ask(pipe.hmget(self._key, ["version", "document"]))
                current = self._parse(document) or self._policy
                # An unreadable document's version still counts: versions only go up.
                if _stored_version(version) > current.version:
                    current = current.model_copy(update={"version": _stored_version(version)})
                earlier: dict[int, ThinkingPolicy] = {}
                if wants is not None:
                    earlier_doc = self._parse(await self._ask(pipe.hget(self._history_key, str(wants))))
                    if earlier_doc is not None:
                        earlier[wants] = earlier_doc
                result = change(current, earlier)
                if result is None:
                    await self._ask(pipe.unwatch())  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    self._install(current)
                    return PolicyUpdate(current, changed=False)
                new, entry = result
                body = new.model_dump_json()
                pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                pipe.hset(self._key, mapping={"version": new.version, "document": body})
                pipe.hset(self._history_key, str(new.version), body)
                pipe.hdel(self._history_key, str(new.version - MAX_HISTORY_VERSIONS))
                pipe.lpush(self._audit_key, entry.model_dump_json())
                pipe.ltrim(self._audit_key, 0, self._audit_max_entries - 1)
                pipe.publish(self._channel, str(new.version))
                try:
                    await self._ask(pipe.execute())
                except WatchError:
                    if expected_version is not None:
                        raise Conflict(
                            f"another flip changed the policy while version {expected_version} was being "
                            "replaced: read it again and re-apply your change",
                            code="stale_policy_version", param="version",
                        ) from None
                    continue  # no version named: apply the change on top of the winner's
            self._install(new)
            self._mark_synced()
            return PolicyUpdate(new, changed=True)
        raise Conflict("the policy kept changing under this flip: try again", code="policy_contended")

    async def replace(
        self, policy: ThinkingPolicy, actor: str, reason: str, expected_version: int | None = None
    ) -> PolicyUpdate:
        """Install a new document under the next version, atomically across replicas."""
        try:
            async with self._deadline():
                return await self._transact(
                    lambda current, _: _replace_with(policy, actor, reason, expected_version)(current),
                    expected_version=expected_version,
                )
        except _REDIS_DOWN as exc:
            raise self._unavailable(exc, "the policy change") from exc

    async def amend(
        self, edit: Edit, actor: str, reason: str, expected_version: int | None = None
    ) -> PolicyUpdate:
        """Install ``edit(document in force in Redis)`` under the next version, atomically across replicas."""
        try:
            async with self._deadline():
                return await self._transact(
                    lambda current, _: _amend_with(edit, actor, reason, expected_version)(current),
                    expected_version=expected_version,
                )
        except _REDIS_DOWN as exc:
            raise self._unavailable(exc, "the policy change") from exc

    async def rollback(self, to_version: int | None, actor: str, reason: str) -> PolicyUpdate:
        """Install an earlier version's content under the next version."""
        target = _rollback_target(self._policy, to_version)

        def change(current: ThinkingPolicy, earlier: dict[int, ThinkingPolicy]) -> Proposal:
            _rollback_target(current, target)
            if target not in earlier:
                raise NotFound(f"version {target} is not in the history", code="no_such_policy_version",
                               param="to_version")
            return next_version(current, earlier[target], actor, reason, action="rollback")

        try:
            async with self._deadline():
                return await self._transact(change, wants=target)
        except _REDIS_DOWN as exc:
            raise self._unavailable(exc, "the rollback") from exc

    async def history(self, limit: int) -> list[ThinkingPolicy]:
        """Earlier documents, newest first."""
        try:
            async with self._deadline():
                stored = await self._ask(self._redis.hgetall(self._history_key))
        except _REDIS_DOWN as exc:
            raise self._unavailable(exc, "reading the history") from exc
        documents = [doc for doc in (self._parse(raw) for raw in stored.values()) if doc is not None]
        return sorted(documents, key=lambda doc: doc.version, reverse=True)[:limit]

    async def audit(self, limit: int) -> list[AuditEntry]:
        """The audit trail, newest first."""
        try:
            async with self._deadline():
                raw = await self._ask(self._redis.lrange(self._audit_key, 0, limit - 1))
        except _REDIS_DOWN as exc:
            raise self._unavailable(exc, "reading the audit trail") from exc
        entries = []
        for item in raw:
            try:
                entries.append(AuditEntry.model_validate_json(item))
            except ValidationError:
                log.error("skipping an unreadable audit entry: %.200s", item)
        return entries
