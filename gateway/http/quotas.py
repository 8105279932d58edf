"""Per-tenant quotas: keyframes per minute (GCRA) and moderation requests at once.

Keyframes per minute is a generic cell rate algorithm: each keyframe pushes the tenant's theoretical
arrival time (TAT) on by 60 s / limit; a request is allowed while the TAT it would leave is at most a
minute ahead of now, so a tenant may spend its whole minute's quota in one burst and then earns it back
evenly. With Redis the TAT lives there and one Lua script checks and moves it, using Redis's own clock, so
the quota holds across every replica; without Redis (or while it is unreachable) it is this process's.

Requests at once is counted per replica (N replicas: up to N × the limit): it bounds what one tenant ties
up in this gateway's memory and threads, while the engine's slots are already shared fairly by admission.

Over a quota a request gets 429 (``rate_limit_error``) with ``Retry-After`` and the headers OpenAI's own API
sends, which OpenAI clients read: ``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` (a keyframe counts as one request there).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.errors import InvalidRequest, Overloaded
from gateway.http.tenants import TenantDirectory

log = logging.getLogger("modgate.quotas")

WINDOW_MS = 60_000

# KEYS[1] the tenant's TAT; ARGV: limit per minute, keyframes asked. Returns {allowed, tat - now (ms)}.
_GCRA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local interval = 60000 / tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval * tonumber(ARGV[2])
if new_tat - now > 60000 then
  return {0, math.ceil(tat - now)}
end
redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil(new_tat - now) + 1000)
return {1, math.ceil(new_tat - now)}
"""


def reset_header(seconds: float) -> str:
    """A duration as OpenAI writes ``x-ratelimit-reset-requests``: ``1s``, ``6m0s``, ``250ms``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


@dataclass(frozen=True, slots=True)
class RateState:
    """One tenant's keyframe quota after a request was checked."""

    allowed: bool
    limit: int
    ahead_ms: float  # how far the TAT is ahead of now: the quota is whole again after this

    @property
    def remaining(self) -> int:
        """Keyframes the tenant may still send at once."""
        interval = WINDOW_MS / self.limit
        return max(0, min(self.limit, math.floor((WINDOW_MS - self.ahead_ms) / interval)))

    def headers(self) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers for this state (reset: until the whole quota is back)."""
        return {
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(self.remaining),
            "x-ratelimit-reset-requests": reset_header(self.ahead_ms / 1000),
        }

    def retry_after_s(self, asked: int) -> int:
        """Seconds until ``asked`` keyframes fit again."""
        interval = WINDOW_MS / self.limit
        return max(1, math.ceil((self.ahead_ms + asked * interval - WINDOW_MS) / 1000))


class QuotaExceeded(Overloaded):
    """A tenant over its quota: 429 with ``Retry-After`` and the ``x-ratelimit-*`` headers."""

    def __init__(self, message: str, *, retry_after: int, code: str, rate_headers: dict[str, str]) -> None:
        super().__init__(message, retry_after=retry_after, code=code)
        self.rate_headers = rate_headers

    def headers(self) -> dict[str, str]:
        """``Retry-After`` and the rate headers."""
        return {**super().headers(), **self.rate_headers}


class MemoryKeyframeRate:
    """GCRA state of this process (no Redis, or Redis unreachable)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._tat: dict[str, float] = {}
        self.clock = clock

    async def take(self, tenant: str, limit: int, keyframes: int) -> RateState:
        """Count ``keyframes`` against ``limit`` per minute if they fit."""
        now = self.clock() * 1000
        tat = max(self._tat.get(tenant, now), now)
        new_tat = tat + WINDOW_MS / limit * keyframes
        if new_tat - now > WINDOW_MS:
            return RateState(False, limit, tat - now)
        self._tat[tenant] = new_tat
        return RateState(True, limit, new_tat - now)


class RedisKeyframeRate:
    """GCRA state in Redis, shared by every replica; this process's memory while Redis fails."""

    def __init__(self, redis: aioredis.Redis, key_prefix: str = "modgate:quota:keyframes") -> None:
        self._script = redis.register_script(_GCRA)
        self.key_prefix = key_prefix
        self.fallback = MemoryKeyframeRate()
        self.local_only = False

    async def take(self, tenant: str, limit: int, keyframes: int) -> RateState:
        """Count ``keyframes`` against ``limit`` per minute if they fit (atomically across replicas)."""
        try:
            allowed, ahead = await self._script(keys=[f"{self.key_prefix}:{tenant}"], args=[limit, keyframes])
        except (RedisError, OSError, TimeoutError) as exc:
            if not self.local_only:
                log.error("keyframe quotas: Redis unreachable (%r); counting per replica meanwhile", exc)
            self.local_only = True
            return await self.fallback.take(tenant, limit, keyframes)
        if self.local_only:
            log.warning("keyframe quotas: Redis answers again; quotas hold across replicas again")
            self.local_only = False
        return RateState(bool(allowed), limit, float(ahead))


class TenantQuotas:
    """Checks a tenant's quotas before its request is worked, and counts what was refused."""

    def __init__(self, directory: TenantDirectory, rate: MemoryKeyframeRate | RedisKeyframeRate) -> None:
        self.directory = directory
        self.rate = rate
        self.inflight: dict[str, int] = {}
        self.refused: dict[tuple[str, str], int] = {}  # (tenant, quota) -> requests refused
        self.last_state: dict[str, RateState] = {}

    def _refuse(self, tenant: str, quota: str) -> None:
        self.refused[tenant, quota] = self.refused.get((tenant, quota), 0) + 1

    async def take_keyframes(self, tenant: str, keyframes: int) -> dict[str, str]:
        """Count a request's keyframes; answers the rate headers (empty: no quota) or raises 429."""
        limit = self.directory.limits(tenant).keyframes_per_minute
        if limit <= 0 or keyframes <= 0:
            return {}
        if keyframes > limit:
            self._refuse(tenant, "keyframes_per_minute")
            raise InvalidRequest(
                f"{keyframes} keyframes in one request exceed the tenant's quota of {limit} a minute: "
                "send fewer at once", param="input", code="request_over_quota",
            )
        state = await self.rate.take(tenant, limit, keyframes)
        self.last_state[tenant] = state
        if not state.allowed:
            self._refuse(tenant, "keyframes_per_minute")
            raise QuotaExceeded(
                f"tenant quota of {limit} keyframes a minute used up: {keyframes} more fit in "
                f"{state.retry_after_s(keyframes)} s",
                retry_after=state.retry_after_s(keyframes),
                code="keyframes_per_minute_exceeded",
                rate_headers=state.headers(),
            )
        return state.headers()

    @contextmanager
    def concurrent(self, tenant: str) -> Iterator[None]:
        """Hold one of the tenant's concurrent requests (429 when it already has its limit under way)."""
        limit = self.directory.limits(tenant).max_concurrent
        under_way = self.inflight.get(tenant, 0)
        if 0 < limit <= under_way:
            self._refuse(tenant, "max_concurrent")
            raise QuotaExceeded(
                f"tenant already has {under_way} requests under way, its limit",
                retry_after=1,
                code="concurrent_requests_exceeded",
                rate_headers={},
            )
        self.inflight[tenant] = under_way + 1
        try:
            yield
        finally:
            self.inflight[tenant] -= 1
