"""The console's server-side state: failed sign-ins counted (then refused for a while), revoked sessions.

- Sign-in attempts: failures are counted per client address and for everyone, in a fixed window of
  ``sign_in_window_s`` seconds that starts at the first failure. Past ``sign_in_max_failures_per_client``
  (one address) or ``sign_in_max_failures`` (everyone: many addresses guessing together), sign-ins are
  refused with 429 and ``Retry-After`` until the window ends, even with the right token, so guessing gains
  nothing. Behind a proxy every client has the proxy's address: the per-address limit then acts as a
  second global one.
- Sessions: a signed cookie verifies on its own, so signing out must be remembered on the server. Signing
  out revokes that session (its id, until it would have expired); signing out everywhere moves an epoch:
  every session issued at or before it is refused. Rotating the admin token needs neither: a session is
  bound to the token's digest (gateway/http/console/sessions.py).

With Redis (``MODGATE_REDIS__URL``) both are shared by every replica; otherwise they hold for this process.
Failing closed where it matters: a session whose revocation cannot be checked (Redis unreachable) is not
accepted (scripts still get in with the admin token in the ``Authorization`` header); the sign-in limit
falls back to this process's counts.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.http.console.sessions import ConsoleSession

log = logging.getLogger("modgate.console")

EVERYONE = "*"  # the counter of every client's failures


@dataclass(frozen=True, slots=True)
class SignInLimits:
    """How many failed sign-ins, from one address and from everyone, within one window."""

    per_client: int
    everyone: int
    window_s: float


class FailureCounter(Protocol):
    """Fixed-window counters of failed sign-ins, by client address (and ``EVERYONE``)."""

    async def count(self, who: str) -> tuple[int, float]:
        """Failures in the current window, and the seconds until it ends (0: no window open)."""
        ...

    async def add(self, who: str, window_s: float) -> None:
        """Count one failure (a new window starts with the first)."""
        ...

    async def clear(self, who: str) -> None:
        """Forget a client's failures (it signed in)."""
        ...


class MemoryFailureCounter:
    """Counts in this process (no Redis, or Redis unreachable)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._windows: dict[str, tuple[int, float]] = {}  # who → (failures, window end)
        self._clock = clock

    async def count(self, who: str) -> tuple[int, float]:
        """Failures in the open window and what is left of it."""
        failures, ends = self._windows.get(who, (0, 0.0))
        left = ends - self._clock()
        if left <= 0:
            self._windows.pop(who, None)
            return 0, 0.0
        return failures, left

    async def add(self, who: str, window_s: float) -> None:
        """One more failure."""
        failures, left = await self.count(who)
        ends = self._clock() + (left if failures else window_s)
        self._windows[who] = (failures + 1, ends)
        if len(self._windows) > 10_000:  # many addresses: drop closed windows
            now = self._clock()
            self._windows = {k: v for k, v in self._windows.items() if v[1] > now}

    async def clear(self, who: str) -> None:
        """Forget a client's failures."""
        self._windows.pop(who, None)


class RedisFailureCounter:
    """Counts shared by every replica: ``INCR`` and an expiry set with the first failure."""

    def __init__(self, client: aioredis.Redis, key_prefix: str = "modgate:console:sign-in-failures") -> None:
        self._redis = client
        self._prefix = key_prefix

    def _key(self, who: str) -> str:
        return f"{self._prefix}:{who}"

    async def count(self, who: str) -> tuple[int, float]:
        """Failures in the open window and what is left of it."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._key(who))
            pipe.pttl(self._key(who))
            raw, ttl_ms = await pipe.execute()
        if raw is None or ttl_ms is None or int(ttl_ms) <= 0:
            return 0, 0.0
        return int(raw), int(ttl_ms) / 1000

    async def add(self, who: str, window_s: float) -> None:
        """One more failure; the first one opens the window."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incr(self._key(who))
            pipe.pexpire(self._key(who), max(1, int(window_s * 1000)), nx=True)
            await pipe.execute()

    async def clear(self, who: str) -> None:
        """Forget a client's failures."""
        await self._redis.delete(self._key(who))


class SignInLimiter:
    """Refuses sign-ins from a client (or from everyone) that failed too often in the window."""

    def __init__(self, limits: SignInLimits, counter: FailureCounter) -> None:
        self.limits = limits
        self._counter = counter
        self._local = MemoryFailureCounter()  # while the shared counter cannot be reached

    async def retry_after(self, client: str) -> int | None:
        """Seconds until this client may try again; None: it may try now."""
        waits = []
        for who, limit in ((client, self.limits.per_client), (EVERYONE, self.limits.everyone)):
            failures, left = await self._count(who)
            if failures >= limit:
                waits.append(left)
        return math.ceil(max(waits)) if waits else None

    async def failed(self, client: str) -> None:
        """Count a failed sign-in from this client (and for everyone)."""
        for who in (client, EVERYONE):
            try:
                await self._counter.add(who, self.limits.window_s)
            except RedisError as exc:
                log.warning("console: sign-in failures counted locally, Redis is unreachable: %s", exc)
                await self._local.add(who, self.limits.window_s)

    async def succeeded(self, client: str) -> None:
        """A client that signed in starts again from zero (the global count stays)."""
        with contextlib.suppress(RedisError):  # the window ends on its own
            await self._counter.clear(client)
        await self._local.clear(client)

    async def _count(self, who: str) -> tuple[int, float]:
        local = await self._local.count(who)
        try:
            shared = await self._counter.count(who)
        except RedisError as exc:
            log.warning("console: sign-in failures read locally, Redis is unreachable: %s", exc)
            return local
        return max(shared, local)


class SessionRevocations(Protocol):
    """Sessions ended before their expiry: one by one (sign-out) or all up to a moment (everywhere)."""

    async def revoke(self, session: ConsoleSession) -> None:
        """End this session wherever its cookie went."""
        ...

    async def revoke_all(self, before: float) -> None:
        """End every session issued at or before ``before`` (Unix seconds)."""
        ...

    async def revoked(self, session: ConsoleSession) -> bool:
        """Whether this session was ended (raises RedisError when that cannot be known)."""
        ...


class MemorySessionRevocations:
    """Revocations in this process (no Redis)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._ids: dict[str, float] = {}  # session id → when it would have expired
        self._epoch = 0.0
        self._clock = clock

    async def revoke(self, session: ConsoleSession) -> None:
        """Remember the id until the session would have expired."""
        now = self._clock()
        self._ids = {sid: expires for sid, expires in self._ids.items() if expires > now}
        self._ids[session.session_id] = session.expires_at

    async def revoke_all(self, before: float) -> None:
        """Move the epoch."""
        self._epoch = max(self._epoch, before)

    async def revoked(self, session: ConsoleSession) -> bool:
        """Revoked by id or issued at or before the epoch."""
        return session.issued_at <= self._epoch or session.session_id in self._ids


class RedisSessionRevocations:
    """Revocations shared by every replica: a key per revoked session (expiring with it) and an epoch."""

    def __init__(self, client: aioredis.Redis, key_prefix: str = "modgate:console") -> None:
        self._redis = client
        self._prefix = key_prefix
        self._clock = time.time

    async def revoke(self, session: ConsoleSession) -> None:
        """Remember the id until the session would have expired."""
        left_ms = max(1, math.ceil((session.expires_at - self._clock()) * 1000))
        await self._redis.set(f"{self._prefix}:revoked:{session.session_id}", "1", px=left_ms)

    async def revoke_all(self, before: float) -> None:
        """Move the epoch forward (never back: two replicas racing keep the later one)."""
        script = (
            "local old = tonumber(redis.call('GET', KEYS[1]) or '0') "
            "if tonumber(ARGV[1]) > old then redis.call('SET', KEYS[1], ARGV[1]) end return 1"
        )
        await self._redis.eval(script, 1, f"{self._prefix}:sessions-epoch", repr(before))

    async def revoked(self, session: ConsoleSession) -> bool:
        """Revoked by id or issued at or before the epoch."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(f"{self._prefix}:sessions-epoch")
            pipe.exists(f"{self._prefix}:revoked:{session.session_id}")
            epoch, revoked = await pipe.execute()
        return session.issued_at <= float(epoch or 0) or bool(revoked)


@dataclass
class ConsoleGuard:
    """What the console routes ask before letting anyone in."""

    limiter: SignInLimiter
    revocations: SessionRevocations

    async def session_in_force(self, session: ConsoleSession) -> bool:
        """A verified session that was not revoked; False too when that cannot be checked (fail closed)."""
        try:
            return not await self.revocations.revoked(session)
        except RedisError as exc:
            log.warning("console: session refused, revocations cannot be read (Redis unreachable): %s", exc)
            return False


def build_console_guard(limits: SignInLimits, state: aioredis.Redis | None) -> ConsoleGuard:
    """In Redis when it is configured (every replica), else in this process."""
    if state is None:
        return ConsoleGuard(SignInLimiter(limits, MemoryFailureCounter()), MemorySessionRevocations())
    return ConsoleGuard(SignInLimiter(limits, RedisFailureCounter(state)), RedisSessionRevocations(state))
