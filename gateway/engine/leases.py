"""Engine slots shared by every gateway replica: a lease-based semaphore per engine in Redis.

Each engine has a sorted set ``<prefix>:<engine url>`` whose members are the slots held right now, scored
by when their lease expires (Redis server time, in milliseconds, so replicas' clocks do not matter).

- acquire: one Lua script drops expired members, then adds ours only if fewer than ``cap`` remain —
  atomic, so two replicas can never both take the last slot;
- fair acquire (``MODGATE_LEASES__FAIR_SHARE``): the same, but the free slot goes only to the waiting tenant
  served least (per weight) on any replica: one fair share across replicas (docs/tenants.md);
- release: ``ZREM``;
- riders: a caller's own Lua may ride in the same script as an acquire or a release
  (:class:`LeaseRider`), so the request path pays one round trip for both (the verdict cache's lookup
  rides with the acquire, its store with the release: gateway/moderation/verdict_cache.py);
- renewal: a background task pushes the expiry of every lease this replica holds ``ttl_s`` ahead again,
  every ``renew_every_s`` seconds. A replica that dies (``kill -9``, a lost node) stops renewing, and its
  slots free themselves within ``ttl_s``: nobody has to clean up after it.

- the engine's own slot count (llama.cpp's ``--parallel``, read from ``/props``): each replica that reads it
  records it in ``<prefix>:<engine url>:slots`` under a ticket taken from Redis before the read, kept only
  if no later-begun reading is there; an acquire for an engine that follows its slots caps at the smaller of
  the asker's cap and that reading. So the newest reading holds on every replica, never a stale larger cap
  from a replica that has not read the restarted engine yet.

- the replicas' registry (``<prefix>:replicas``): each replica's heartbeat (:meth:`EngineLeases.beat`, the
  pool's, every half second), scored by Redis time, counted for three ``ttl_s`` after the last. It tells a
  replica how many share the engines, so that while Redis is unreachable it serves on its share of each cap
  (the cap / the replicas last seen). A replica whose heartbeat is older than ``stale_s`` (but younger than
  ``ttl_s``) may be doing just that, so every acquire holds its share back; it takes local slots only once
  every other replica sees it stale (:meth:`EngineLeases.local_after`), and adopts its running calls as
  leases (:meth:`EngineLeases.adopt`, whatever the cap) before it beats again.

A lease found gone at renewal (this replica stalled for longer than ``ttl_s``, or Redis lost its data) is
logged and dropped, not re-added: re-adding could push the engine past its cap.

The Redis client is the service's one (gateway/http/services.py). It retries nothing, which matters here:
an acquire that timed out may have run, and running it again could take a second slot. Its socket timeouts
are the service's, longer than a request should wait for a slot, so each call here runs under a deadline of
its own (``timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.tasks import stop

log = logging.getLogger("modgate.leases")

LEASE_STORE_DOWN = (RedisError, OSError, TimeoutError)
"""What a call to an unreachable or failing Redis raises."""

# The cap an acquire holds to: the asker's (ARGV[1]), or the engine's newest recorded slot count if smaller
# and the asker follows the engine's slots (``follows`` "1"; ``said`` the key of the engine's reading); less
# the shares of the other replicas whose heartbeat in ``registry`` is older than ``stale_ms`` (and younger
# than the ttl: a replica silent longer is gone): they may be serving on local caps now (Redis unreachable
# for them), each on its share, the cap / the replicas it saw at its last heartbeat (at least 1).
_CAP = """
local function now_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end
local function cap_of(follows, said, now, registry, me, stale_ms, ttl)
  local cap = tonumber(ARGV[1])
  if follows == '1' then
    local slots = tonumber(redis.call('HGET', said, 'slots') or '')
    if slots and slots < cap then cap = slots end
  end
  local reserve = 0
  for _, other in ipairs(redis.call('ZRANGEBYSCORE', registry, now - ttl, '(' .. (now - stale_ms))) do
    if other ~= me then
      local seen = tonumber(redis.call('GET', registry .. ':seen:' .. other) or '1') or 1
      reserve = reserve + math.max(1, math.floor(cap / math.max(1, seen)))
    end
  end
  return cap - reserve
end
"""

# KEYS[1] the engine's set, KEYS[2] its slot reading, KEYS[3] the replicas' registry; ARGV: cap, ttl in ms,
# our member, follows its slots, this replica's name, how old a heartbeat is stale in ms. Returns 1 when the
# slot is ours.
_ACQUIRE = _CAP + """
local now = now_ms()
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local cap = cap_of(ARGV[4], KEYS[2], now, KEYS[3], ARGV[5], tonumber(ARGV[6]), ttl)
if redis.call('ZCARD', KEYS[1]) >= cap then
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
"""

# One fair share across replicas (VTC, as gateway/engine/fairness.py does within one replica), decided here
# with the slot. KEYS: the engine's slots, its tenants' virtual counters (served work / weight), its waiting
# tenants (scored by when their wait lapses unless renewed). ARGV: cap, ttl in ms, our member, the tenant
# ("" for background work), the call's work / the tenant's weight, how long a wait stays registered in ms.
# A tenant waiting for the first time is lifted to the lowest waiting counter (no credit banked while
# idle); a free slot goes only to a waiting tenant whose counter is the lowest of all waiting tenants, on
# whichever replica it waits (ties: to the one holding fewer slots); background work only when no tenant
# waits anywhere. Slot members begin with their tenant and a \x1f. KEYS[4] and ARGV[7]: the engine's slot
# reading and whether the asker follows it; KEYS[5], ARGV[8] and ARGV[9]: the replicas' registry, this
# replica's name, how old a heartbeat is stale (as _ACQUIRE). Returns 1 when granted.
_ACQUIRE_FAIR = _CAP + """
local now = now_ms()
local ttl = tonumber(ARGV[2])
local cap = cap_of(ARGV[7], KEYS[4], now, KEYS[5], ARGV[8], tonumber(ARGV[9]), ttl)
local tenant = ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local held = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local owner = string.match(member, '^(.-)\\31')
  if owner then held[owner] = (held[owner] or 0) + 1 end
end
local lowest, lowest_held = nil, nil
for _, other in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  if other ~= tenant then
    local counter = tonumber(redis.call('ZSCORE', KEYS[2], other) or '0')
    local other_held = held[other] or 0
    if lowest == nil or counter < lowest or (counter == lowest and other_held < lowest_held) then
      lowest, lowest_held = counter, other_held
    end
  end
end
if tenant == '' then
  if lowest ~= nil or redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
else
  local mine = tonumber(redis.call('ZSCORE', KEYS[2], tenant) or '0')
  if redis.call('ZSCORE', KEYS[3], tenant) == false and lowest ~= nil and mine < lowest then
    mine = lowest
    redis.call('ZADD', KEYS[2], mine, tenant)
  end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), tenant)
  redis.call('PEXPIRE', KEYS[3], ttl)
  if redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
  -- ties go to the tenant holding fewer slots now: a quiet tenant lifted to a busy one's level goes first
  if lowest ~= nil and (mine > lowest or (mine == lowest and (held[tenant] or 0) > lowest_held)) then
    return 0
  end
  redis.call('ZINCRBY', KEYS[2], ARGV[5], tenant)
  redis.call('ZREM', KEYS[3], tenant)
  redis.call('PEXPIRE', KEYS[2], 3600000)
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
"""

# KEYS[1] the engine's set; ARGV: ttl in ms, then our members. Extends the members still there (never
# re-adds an expired one) and returns the members that were gone.
_RENEW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return lost
"""

# KEYS[1] the replicas' registry; ARGV: ttl in ms, this replica's name, the Redis time after which the
# heartbeat is too late (0: none). Its heartbeat, scored by Redis time, unless too late: one that ran long
# after its sender gave up on it would make a replica serving on local caps look present. Members silent
# for three ttls are dropped (the replicas seen count them that long: a replica just killed, or not
# registered yet, makes shares smaller, never larger); each member's count of replicas seen is kept beside
# it. Returns the replicas seen (-1: too late) and the Redis time.
_BEAT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if tonumber(ARGV[3]) > 0 and now > tonumber(ARGV[3]) then return {-1, now} end
local horizon = 3 * tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - horizon)
redis.call('PEXPIRE', KEYS[1], horizon)
local seen = redis.call('ZCARD', KEYS[1])
redis.call('SET', KEYS[1] .. ':seen:' .. ARGV[2], seen, 'PX', horizon)
return {seen, now}
"""

# KEYS[1] the engine's set; ARGV: ttl in ms, then members of calls already running, added whatever the cap:
# the set then says what the engine really has, and new acquires wait until it is under the cap again.
_ADOPT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return #ARGV - 1
"""

# KEYS[1] the engine's slot reading; ARGV: the reading's ticket, the slots it read. Kept unless a reading
# begun later (a higher ticket) is there already; returns the slots now recorded.
_RECORD_SLOTS = """
if tonumber(ARGV[1]) > tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'slots', ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], 86400000)
return tonumber(redis.call('HGET', KEYS[1], 'slots'))
"""

# KEYS[1] the engine's set. Live members only.
_COUNT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


@dataclass(slots=True, eq=False)
class LeaseRider:
    """Lua that rides in the same script as a lease's acquire or release: one round trip for both.

    ``lua`` is the body of a Lua function that reads its keys from ``KEYS[K + i]`` and its arguments from
    ``ARGV[A + i]`` (``K`` and ``A`` are the lease call's own counts, set as locals before it) and returns a
    value. With an acquire it runs first, and any value but ``false`` withholds the slot: the lease's keys
    are not touched and the value comes back in ``result``. With a release it runs after the ``ZREM``.
    It rides only on ``client`` (the lease's own Redis), else it is left for its owner to run alone.
    """

    lua: str
    keys: list[str]
    args: list[str | int | float]
    client: Redis
    ran: bool = False  # sent with a lease call (``error`` says whether Redis answered)
    result: Any = None  # what it returned when it withheld a slot
    error: BaseException | None = field(default=None, repr=False)

    @property
    def withheld(self) -> bool:
        """It ran with an acquire and withheld the slot."""
        return self.ran and self.error is None and self.result is not None


def with_rider(lease_lua: str, key_count: int, arg_count: int, rider_lua: str) -> str:
    """One script: the rider's Lua, then (unless it returned a value: ``{-1, value}``) ``lease_lua``, whose
    KEYS and ARGV come first."""
    return (f"local K, A = {key_count}, {arg_count}\nlocal function rider()\n{rider_lua}\nend\n"
            f"local found = rider()\nif found then return {{-1, found}} end\n{lease_lua}")


# KEYS[1] the engine's set; ARGV[1] the member given back; the rider's keys and arguments after them.
_RELEASE_WITH_RIDER = """
redis.call('ZREM', KEYS[1], ARGV[1])
local K, A = 1, 1
local function rider()
RIDER
end
rider()
return 1
"""


def replica_name() -> str:
    """This process's name in lease members: host, pid and a random tag (pids repeat across restarts)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class EngineLeases:
    """Cross-replica engine slots in Redis; ``try_acquire`` never waits, the caller decides how to wait.

    Every call raises one of :data:`LEASE_STORE_DOWN` when Redis cannot answer; what to do then (serve on
    the local cap alone) is the engine pool's decision, not this class's.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        key_prefix: str = "modgate:engine-leases",
        ttl_s: float = 10.0,
        renew_every_s: float = 3.0,
        timeout_s: float = 0.5,
        replica: str | None = None,
        stale_s: float = 1.5,
    ) -> None:
        if not 0 < renew_every_s < ttl_s:
            raise ValueError("leases must be renewed more often than they expire (0 < renew_every_s < ttl_s)")
        self._redis = redis
        self.key_prefix = key_prefix
        self.ttl_s = ttl_s
        self.renew_every_s = renew_every_s
        self.timeout_s = timeout_s  # each call's deadline: the most a hung Redis costs a request
        self.replica = replica or replica_name()
        # A replica whose heartbeat (:meth:`beat`) is older than this may be on local caps: the others hold
        # its share back, and it takes no local slot until this long after its last heartbeat answered.
        self.stale_s = stale_s
        self.replicas_seen = 1  # replicas in the registry at the last heartbeat (1: never answered)
        self.last_beat: float | None = None  # time.monotonic() when the last heartbeat's answer came
        self._beat_sent = 0.0  # time.monotonic() when the last heartbeat was sent (answered or not)
        self._clock: tuple[int, float] | None = None  # Redis time at the last heartbeat, and monotonic then
        self._acquire = redis.register_script(_ACQUIRE)
        self._beat = redis.register_script(_BEAT)
        self._adopt = redis.register_script(_ADOPT)
        self._acquire_fair = redis.register_script(_ACQUIRE_FAIR)
        self.wait_registration_ms = 500  # a waiting tenant's registration lapses this long after its last ask
        self._renew = redis.register_script(_RENEW)
        self._count = redis.register_script(_COUNT)
        self._record_slots = redis.register_script(_RECORD_SLOTS)
        self._scripts: dict[tuple[str, str], AsyncScript] = {}  # a lease script with a rider, by the two
        self._ids = itertools.count(1)
        self._held: dict[str, set[str]] = {}  # engine key -> our members
        self._renewer: asyncio.Task[None] | None = None
        self.lost = 0  # leases found expired at renewal
        # Of those, the ones whose call still runs: outside the shared cap until it ends (released).
        self.running_unleased: set[str] = set()

    @contextlib.asynccontextmanager
    async def _deadline(self) -> AsyncIterator[None]:
        """One call's ``timeout_s``: a Redis that hangs fails the call as a dead one would."""
        try:
            async with asyncio.timeout(self.timeout_s):
                yield
        except TimeoutError as exc:
            raise RedisTimeoutError(f"Redis did not answer within {self.timeout_s:g} s") from exc

    def key(self, engine: str) -> str:
        """The sorted set of ``engine``'s slots (every replica must name the engine by the same URL)."""
        return f"{self.key_prefix}:{engine}"

    @property
    def registry_key(self) -> str:
        """The sorted set of the replicas sharing the engines, scored by their last heartbeat."""
        return f"{self.key_prefix}:replicas"

    def _registry_args(self) -> list[str | int | float]:
        return [self.replica, round(self.stale_s * 1000)]

    async def beat(self) -> int:
        """Say this replica is here (the registry keeps it after its last heartbeat); the replicas seen, kept
        in :attr:`replicas_seen` for the time Redis cannot be asked. A heartbeat Redis would run more than
        twice ``timeout_s`` after it was sent (a stalled Redis waking up) is not recorded."""
        sent = time.monotonic()
        not_after = 0
        if self._clock is not None:
            redis_ms, at = self._clock
            not_after = round(redis_ms + (sent - at + 2 * self.timeout_s) * 1000)
        self._beat_sent = sent
        async with self._deadline():
            seen, now = await self._beat(keys=[self.registry_key],
                                         args=[round(self.ttl_s * 1000), self.replica, not_after])
        if int(seen) < 0:
            raise RedisTimeoutError("the heartbeat reached Redis after its deadline")
        self.last_beat = time.monotonic()
        self._clock = (int(now), self.last_beat)
        self.replicas_seen = max(1, int(seen))
        return self.replicas_seen

    def local_after(self) -> float | None:
        """When (time.monotonic()) every other replica sees this one's heartbeat stale, so holds its share
        back: a heartbeat sent may still land up to twice ``timeout_s`` later. None: it never answered (no
        other replica knows of this one)."""
        if self.last_beat is None:
            return None
        return max(self.last_beat, self._beat_sent + 2 * self.timeout_s) + self.stale_s

    async def adopt(self, engine: str, count: int) -> list[str]:
        """Leases for ``count`` calls already running at ``engine`` (admitted while Redis could not be asked),
        added whatever the cap: the shared set then counts them, and new acquires wait for room."""
        if count <= 0:
            return []
        members = [f"{self.replica}/{next(self._ids)}" for _ in range(count)]
        async with self._deadline():
            await self._adopt(keys=[self.key(engine)], args=[round(self.ttl_s * 1000), *members])
        self._held.setdefault(engine, set()).update(members)
        return members

    def slots_key(self, engine: str) -> str:
        """The hash of ``engine``'s newest slot reading (``slots``, ``epoch``; ``tickets`` handed out)."""
        return f"{self.key(engine)}:slots"

    async def slots_ticket(self, engine: str) -> int:
        """A ticket for a reading of ``engine``'s slots about to begin: later-begun ones get higher ones."""
        async with self._deadline():
            return int(await self._redis.hincrby(self.slots_key(engine), "tickets", 1))

    async def record_slots(self, engine: str, ticket: int, slots: int) -> int:
        """Record the slots a reading with ``ticket`` found, unless a later-begun reading is recorded; the
        slots recorded now."""
        async with self._deadline():
            return int(await self._record_slots(keys=[self.slots_key(engine)], args=[ticket, slots]))

    def held(self, engine: str) -> int:
        """Leases this replica holds on ``engine``."""
        return len(self._held.get(engine, ()))

    def carries(self, rider: LeaseRider) -> bool:
        """Whether ``rider`` can ride with this replica's lease calls (it is for the same Redis)."""
        return rider.client is self._redis

    def _script(self, lease_lua: str, rider_lua: str, keys: int, args: int) -> AsyncScript:
        """The lease's script with the rider's, registered once (the same texts make the same script)."""
        script = self._scripts.get((lease_lua, rider_lua))
        if script is None:
            combined = (_RELEASE_WITH_RIDER.replace("RIDER", rider_lua, 1) if lease_lua == _RELEASE_WITH_RIDER
                        else with_rider(lease_lua, keys, args, rider_lua))
            script = self._scripts[lease_lua, rider_lua] = self._redis.register_script(combined)
        return script

    async def _acquire_with(
        self, lease_lua: str, plain: AsyncScript, keys: list[str], args: list[str | int | float],
        rider: LeaseRider | None,
    ) -> bool:
        """Run an acquire script (with ``rider`` first if it can ride); True when the slot was granted."""
        if rider is None or not self.carries(rider):
            async with self._deadline():
                return bool(await plain(keys=keys, args=args))
        script = self._script(lease_lua, rider.lua, len(keys), len(args))
        rider.ran = True
        try:
            async with self._deadline():
                answer = await script(keys=[*keys, *rider.keys], args=[*args, *rider.args])
        except LEASE_STORE_DOWN as exc:
            rider.error = exc
            raise
        if isinstance(answer, list):  # {-1, found}: the rider withheld the slot
            rider.result = answer[1]
            return False
        return bool(answer)

    async def try_acquire(
        self, engine: str, cap: int, rider: LeaseRider | None = None, *, follows_slots: bool = False
    ) -> str | None:
        """A slot of ``engine`` if fewer than ``cap`` are held across replicas: its lease id, else None.

        ``rider``: run first in the same script; a value from it withholds the slot (see :class:`LeaseRider`).
        ``follows_slots``: the cap is also the engine's newest recorded slot count (:meth:`record_slots`).
        """
        member = f"{self.replica}/{next(self._ids)}"
        keys = [self.key(engine), self.slots_key(engine), self.registry_key]
        args: list[str | int | float] = [cap, round(self.ttl_s * 1000), member, int(follows_slots),
                                         *self._registry_args()]
        if not await self._acquire_with(_ACQUIRE, self._acquire, keys, args, rider):
            return None
        self._held.setdefault(engine, set()).add(member)
        return member

    async def try_acquire_fair(
        self, engine: str, cap: int, tenant: str, work_per_weight: float, rider: LeaseRider | None = None,
        *, follows_slots: bool = False,
    ) -> str | None:
        """A slot of ``engine`` for ``tenant`` if one is free and no tenant waiting on any replica has been
        served less (per weight); ``tenant`` "" is background work, served only when no tenant waits.

        Asking registers ``tenant`` as waiting (until ``wait_registration_ms`` after its last ask), which is
        how the other replicas learn of it: ask again (the pool polls) while the call waits. ``rider``: as
        :meth:`try_acquire` (a rider that withholds the slot leaves ``tenant`` unregistered too), and so is
        ``follows_slots``.
        """
        member = f"{tenant}\x1f{self.replica}/{next(self._ids)}"
        keys = [self.key(engine), f"{self.key(engine)}:served", f"{self.key(engine)}:waiting",
                self.slots_key(engine), self.registry_key]
        args: list[str | int | float] = [
            cap, round(self.ttl_s * 1000), member, tenant, work_per_weight, self.wait_registration_ms,
            int(follows_slots), *self._registry_args(),
        ]
        if not await self._acquire_with(_ACQUIRE_FAIR, self._acquire_fair, keys, args, rider):
            return None
        self._held.setdefault(engine, set()).add(member)
        return member

    async def release(self, engine: str, lease: str, rider: LeaseRider | None = None) -> None:
        """Give a slot back (stops its renewal first: if Redis is down now, the lease still expires).

        ``rider``: run after the ``ZREM`` in the same script (see :class:`LeaseRider`)."""
        self._held.get(engine, set()).discard(lease)
        self.running_unleased.discard(lease)
        if rider is None or not self.carries(rider):
            async with self._deadline():
                await self._redis.zrem(self.key(engine), lease)
            return
        rider.ran = True
        try:
            async with self._deadline():
                await self._script(_RELEASE_WITH_RIDER, rider.lua, 1, 1)(
                    keys=[self.key(engine), *rider.keys], args=[lease, *rider.args]
                )
        except LEASE_STORE_DOWN as exc:
            rider.error = exc
            raise

    async def count(self, engine: str) -> int:
        """Slots of ``engine`` held by all replicas now."""
        async with self._deadline():
            return int(await self._count(keys=[self.key(engine)]))

    async def renew(self) -> None:
        """Push every held lease's expiry ``ttl_s`` ahead; drop (and count) the ones that had expired."""
        ttl_ms = round(self.ttl_s * 1000)
        for engine, members in list(self._held.items()):
            if not members:
                continue
            async with self._deadline():
                lost = await self._renew(keys=[self.key(engine)], args=[ttl_ms, *sorted(members)])
            for raw in lost:
                member = raw.decode() if isinstance(raw, bytes) else raw
                if member not in members:  # released while the renewal was on its way: given back, not lost
                    continue
                members.discard(member)
                self.running_unleased.add(member)
                self.lost += 1
                log.error(
                    "engine %s: lease %s expired before it was renewed (this replica stalled, or Redis lost"
                    " it); its call runs on without a shared slot, so the engine may briefly exceed its cap",
                    engine, member,
                )

    def start(self) -> None:
        """Renew held leases every ``renew_every_s`` seconds in the background."""
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_forever(), name="engine-lease-renewal")

    async def _renew_forever(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                await self.renew()
            except LEASE_STORE_DOWN as exc:
                if not failing:
                    log.error("cannot renew engine leases in Redis (%s): they lapse in %g s", exc, self.ttl_s)
                failing = True
            else:
                if failing:
                    log.warning("engine leases renewed again")
                failing = False

    async def aclose(self) -> None:
        """Stop renewing and give back what is still held (best effort; the client is the service's)."""
        await stop(self._renewer)
        with contextlib.suppress(*LEASE_STORE_DOWN):
            for engine, members in self._held.items():
                if members:
                    async with self._deadline():
                        await self._redis.zrem(self.key(engine), *members)
            async with self._deadline():
                await self._redis.zrem(self.registry_key, self.replica)
        self._held.clear()
