"""Verdicts of keyframes already seen, reused instead of asking the engine again.

Two kinds of reuse, both only within one scope (tenant, what of the policy reaches the engine request:
thinking mode, output caps and thinking budget, verdict format; system prompt, caller text, the engine's
model: id, root and revision): a verdict is a judgement made by one model under one engine request, and a
tenant must not learn from a ``reused`` flag what another tenant posted. The policy enters the scope by the
digest of its terms (``ThinkingDecision.terms_digest``), never by its version number: numbering restarts at
1 when the policy's Redis key is lost, and a later "version 2" with other limits must not find the first
"version 2"'s verdicts. The version a verdict was made under is kept in the stored value, for audit.

- exact: the shaped frame's SHA-256 was judged before;
- near: a frame whose perceptual hash is within ``max_distance`` bits, *and* whose 16×9 colour
  thumbnail differs by at most ``max_colour_delta`` in every cell (both made by the shaping step from
  the frame reduced 8×: ``ShapedImage.phash`` and ``ShapedImage.thumbnail``). The thumbnail check is
  there because the 64-bit pHash is computed on grey levels at 32×32: on the synthetic keyframes an
  "allow" scene and the same scene with its violence markers (two saturated corner squares a sixth of the
  frame high) are 2 bits apart, so a pHash alone would hand a blocked frame an "allow". Their thumbnails
  differ by more than 120 levels in a corner cell; a re-encode, sensor noise or a few pixels of shift
  stay under 10.

Near-duplicate search uses the pigeonhole principle: the 64 bits are cut into ``max_distance + 1`` bands,
and two hashes at most ``max_distance`` bits apart agree exactly on at least one band. Each stored frame is
indexed under each of its bands; a lookup reads the frames that share a band and checks them exactly.

Two stores behind one interface: in memory (least recently used, with a TTL) and Redis (keys with a TTL,
band sets as Redis sets). Reuse is an optimisation: a Redis failure is logged and read as a miss, never
turned into a failed moderation.

In Redis a lookup (under every scope searched) and a store (of every verdict an engine call made) are one
Lua script each, one command. Each can also ride with an engine lease's script (gateway/engine/leases.py):
the lookup with the acquire, which it withholds when it found anything; the store with the release. So a
keyframe the engine judges costs two round trips to Redis, not four.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.engine.leases import LeaseRider
from shaping.verdict import ACTIONS, KeyframeVerdict

log = logging.getLogger("modgate.verdict_cache")

Reuse = Literal["exact", "near"]
PHASH_BITS = 64


def colour_delta(first: bytes, second: bytes) -> int:
    """The largest difference of any cell's channel between two thumbnails (0..255)."""
    a = np.frombuffer(first, dtype=np.uint8).astype(np.int16)
    b = np.frombuffer(second, dtype=np.uint8).astype(np.int16)
    if a.shape != b.shape:
        return 255
    return int(np.abs(a - b).max()) if a.size else 0


def hamming(first: int, second: int) -> int:
    """Bits that differ between two hashes."""
    return (first ^ second).bit_count()


def phash_bands(phash: int, max_distance: int) -> list[tuple[int, int]]:
    """``(band index, band value)`` for each of ``max_distance + 1`` contiguous bands of the 64-bit hash."""
    count = max_distance + 1
    bands, start = [], 0
    for index in range(count):
        width = PHASH_BITS // count + (1 if index < PHASH_BITS % count else 0)
        bands.append((index, (phash >> start) & ((1 << width) - 1)))
        start += width
    return bands


@dataclass(frozen=True, slots=True)
class VerdictScope:
    """What a verdict was made under; verdicts are reused only inside the same scope."""

    tenant: str
    policy_terms: str  # ThinkingDecision.terms_digest() of the engine request the verdict comes from
    thinking: str
    prompt_sha256: str  # the system prompt as sent (with any block-filling guidance)
    text_sha256: str = ""  # caller text sent with the frame, if any
    model: str = ""  # the engine's model: id, root and revision (new weights never reuse old verdicts)
    verdict_format: str = "compact"  # compact or json: the same frame may be judged apart in each

    @property
    def key(self) -> str:
        """A short, Redis-safe name for the scope (``terms:`` marks the policy by its terms: a key made by
        version number, before, is never this key, so such entries miss and expire)."""
        raw = "\x1f".join(
            (self.tenant, f"terms:{self.policy_terms}", self.thinking, self.prompt_sha256, self.text_sha256,
             self.model, self.verdict_format)
        )
        return hashlib.sha256(raw.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class FrameIdentity:
    """A shaped frame as the cache knows it."""

    sha256: str
    phash: int | None  # None: shaped without it (``ShapedImage.phash``), near no other frame
    thumbnail: bytes  # ShapedImage.thumbnail: the shaping step's 16×9 colour cell means

    @property
    def looked_up_phash(self) -> int:
        """The pHash the cache files and finds it by: every frame of a request that uses the cache has one."""
        if self.phash is None:
            raise ValueError("the verdict cache was asked about a frame shaped without its pHash")
        return self.phash


@dataclass(frozen=True, slots=True)
class StoredVerdict:
    """A verdict kept for reuse, with the frame it was made for."""

    action: str
    categories: tuple[str, ...]
    confidence: float | None  # from the engine's logprobs when it gave them
    sha256: str
    phash: int
    thumbnail: bytes
    made_at: float
    request_id: str
    category_scores: tuple[tuple[str, float], ...] | None = None  # from logprobs, as first answered
    policy_version: int | None = None  # the policy's number when it was judged: for audit, never matched

    @property
    def identity(self) -> FrameIdentity:
        """The frame this verdict was made for."""
        return FrameIdentity(self.sha256, self.phash, self.thumbnail)

    def verdict(self) -> KeyframeVerdict:
        """The stored verdict as the moderation path uses it."""
        action = self.action if self.action in ACTIONS else "review"
        return KeyframeVerdict(
            action=action,
            categories=self.categories,
            confidence=self.confidence,
            category_scores=self.category_scores,
            confidence_note=None if self.confidence is not None else "no logprobs when it was first judged",
        )

    def to_json(self) -> str:
        """Redis value."""
        return json.dumps({
            "action": self.action, "categories": list(self.categories), "confidence": self.confidence,
            "sha256": self.sha256, "phash": f"{self.phash:016x}",
            "thumbnail": base64.b64encode(self.thumbnail).decode(), "made_at": self.made_at,
            "request_id": self.request_id,
            "category_scores": None if self.category_scores is None else dict(self.category_scores),
            "policy_version": self.policy_version,
        })

    @classmethod
    def from_json(cls, raw: str | bytes) -> StoredVerdict:
        """Read a Redis value."""
        data = json.loads(raw)
        return cls(
            action=str(data["action"]), categories=tuple(data["categories"]),
            confidence=None if data.get("confidence") is None else float(data["confidence"]),
            sha256=str(data["sha256"]), phash=int(data["phash"], 16),
            thumbnail=base64.b64decode(data["thumbnail"]), made_at=float(data["made_at"]),
            request_id=str(data["request_id"]),
            category_scores=(
                None if not isinstance(data.get("category_scores"), dict)
                else tuple((str(k), float(v)) for k, v in data["category_scores"].items())
            ),
            policy_version=None if data.get("policy_version") is None else int(data["policy_version"]),
        )


@dataclass(frozen=True, slots=True)
class ReusedVerdict:
    """A cache hit: the stored verdict and how it matched."""

    stored: StoredVerdict
    reused: Reuse
    distance: int  # pHash bits apart (0 for an exact hit)


@dataclass(frozen=True, slots=True)
class NearDuplicateRule:
    """When two different frames count as the same picture."""

    max_distance: int = 4  # pHash bits; -1: exact reuse only
    max_colour_delta: int = 32  # thumbnail levels (0..255)

    @property
    def enabled(self) -> bool:
        """Near-duplicate reuse is on."""
        return self.max_distance >= 0

    def matches(self, frame: FrameIdentity, other: FrameIdentity) -> int | None:
        """The pHash distance if ``other`` is a near duplicate of ``frame``, else None."""
        if not self.enabled or frame.phash is None or other.phash is None:
            return None
        distance = hamming(frame.phash, other.phash)
        if distance > self.max_distance:
            return None
        if colour_delta(frame.thumbnail, other.thumbnail) > self.max_colour_delta:
            return None
        return distance


def closest(
    frame: FrameIdentity, candidates: list[StoredVerdict], rule: NearDuplicateRule
) -> ReusedVerdict | None:
    """The nearest candidate that passes the rule (ties: the most recent verdict)."""
    best: ReusedVerdict | None = None
    for stored in candidates:
        if stored.sha256 == frame.sha256:
            return ReusedVerdict(stored, "exact", 0)
        distance = rule.matches(frame, stored.identity)
        if distance is None:
            continue
        if best is None or (distance, -stored.made_at) < (best.distance, -best.stored.made_at):
            best = ReusedVerdict(stored, "near", distance)
    return best


def best_hit(hits: Sequence[ReusedVerdict | None]) -> ReusedVerdict | None:
    """The verdict to reuse among one frame's lookups under several scopes (in the pool's engine order): an
    exact hit before a near one, then the nearest, then the scope of the engine listed first."""
    found = [(hit.reused != "exact", hit.distance, order, hit) for order, hit in enumerate(hits) if hit]
    return min(found, key=lambda item: item[:3])[3] if found else None


class VerdictCache(Protocol):
    """Where reusable verdicts live."""

    rule: NearDuplicateRule

    async def lookup(self, scope: VerdictScope, frame: FrameIdentity) -> ReusedVerdict | None:
        """An exact hit, else the nearest near duplicate, else None."""
        ...

    async def lookup_any(self, scopes: Sequence[VerdictScope], frame: FrameIdentity) -> ReusedVerdict | None:
        """The best verdict for ``frame`` under any of ``scopes`` (:func:`best_hit`)."""
        ...

    async def store(self, scope: VerdictScope, stored: StoredVerdict) -> None:
        """Keep a fresh engine verdict for reuse."""
        ...

    async def store_all(self, kept: Sequence[tuple[VerdictScope, StoredVerdict]]) -> None:
        """Keep several fresh verdicts, each under its scope."""
        ...

    def lookup_rider(self, scopes: Sequence[VerdictScope], frame: FrameIdentity) -> RidingLookup | None:
        """The lookup as Lua that rides with an engine lease's acquire (None: this store cannot ride)."""
        ...

    def store_rider(self, kept: Sequence[tuple[VerdictScope, StoredVerdict]]) -> LeaseRider | None:
        """The store as Lua that rides with an engine lease's release (None: this store cannot ride, or
        nothing to keep)."""
        ...


class MemoryVerdictCache:
    """One process's verdicts: least recently used evicted past ``max_entries``, each kept ``ttl_s``."""

    def __init__(self, ttl_s: float, max_entries: int, rule: NearDuplicateRule) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.rule = rule
        self._entries: OrderedDict[tuple[str, str], tuple[float, StoredVerdict]] = OrderedDict()
        self._bands: dict[tuple[str, int, int], set[str]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, scope_key: str, sha256: str, now: float) -> StoredVerdict | None:
        item = self._entries.get((scope_key, sha256))
        if item is None:
            return None
        expires_at, stored = item
        if expires_at <= now:
            self._drop(scope_key, sha256)
            return None
        return stored

    def _drop(self, scope_key: str, sha256: str) -> None:
        item = self._entries.pop((scope_key, sha256), None)
        if item is None or not self.rule.enabled:
            return
        for band in phash_bands(item[1].phash, self.rule.max_distance):
            members = self._bands.get((scope_key, *band))
            if members is not None:
                members.discard(sha256)
                if not members:
                    del self._bands[(scope_key, *band)]

    async def lookup(self, scope: VerdictScope, frame: FrameIdentity) -> ReusedVerdict | None:
        """An exact hit, else the nearest near duplicate, else None."""
        now = time.monotonic()
        exact = self._live(scope.key, frame.sha256, now)
        if exact is not None:
            self._entries.move_to_end((scope.key, frame.sha256))
            return ReusedVerdict(exact, "exact", 0)
        if not self.rule.enabled:
            return None
        shas: set[str] = set()
        for band in phash_bands(frame.looked_up_phash, self.rule.max_distance):
            shas |= self._bands.get((scope.key, *band), set())
        candidates = [stored for sha in shas if (stored := self._live(scope.key, sha, now)) is not None]
        found = closest(frame, candidates, self.rule)
        if found is not None:
            self._entries.move_to_end((scope.key, found.stored.sha256))
        return found

    async def store(self, scope: VerdictScope, stored: StoredVerdict) -> None:
        """Keep a fresh engine verdict for reuse."""
        if self.ttl_s <= 0:
            return
        self._drop(scope.key, stored.sha256)
        self._entries[(scope.key, stored.sha256)] = (time.monotonic() + self.ttl_s, stored)
        if self.rule.enabled:
            for band in phash_bands(stored.phash, self.rule.max_distance):
                self._bands.setdefault((scope.key, *band), set()).add(stored.sha256)
        while len(self._entries) > self.max_entries:
            (scope_key, sha256), _ = next(iter(self._entries.items()))
            self._drop(scope_key, sha256)


    async def lookup_any(self, scopes: Sequence[VerdictScope], frame: FrameIdentity) -> ReusedVerdict | None:
        """The best verdict for ``frame`` under any of ``scopes`` (:func:`best_hit`)."""
        return best_hit([await self.lookup(scope, frame) for scope in scopes])

    async def store_all(self, kept: Sequence[tuple[VerdictScope, StoredVerdict]]) -> None:
        """Keep several fresh verdicts, each under its scope."""
        for scope, stored in kept:
            await self.store(scope, stored)

    def lookup_rider(self, scopes: Sequence[VerdictScope], frame: FrameIdentity) -> RidingLookup | None:
        """In memory: nothing to ride."""
        return None

    def store_rider(self, kept: Sequence[tuple[VerdictScope, StoredVerdict]]) -> LeaseRider | None:
        """In memory: nothing to ride."""
        return None


# The Lua of the Redis store, as rider bodies (gateway/engine/leases.py: keys from KEYS[K + i], arguments
# from ARGV[A + i]). Lookup: ARGV scopes, band keys per scope, then each scope's entry-key prefix; KEYS per
# scope its exact entry, then its band sets. Per scope: {exact value or false, {near candidates' values}};
# false when no scope has anything. A band member whose entry expired is removed from the sets read. The
# candidates' entries are read by a name made here, not passed in KEYS: fine on one Redis server (plain or
# behind Sentinel), which is what modgate runs on; not on Redis Cluster.
_LOOKUP = """
local scopes, bands = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2])
local found, any = {}, false
for s = 1, scopes do
  local base = K + (s - 1) * (bands + 1)
  local exact = redis.call('GET', KEYS[base + 1])
  local near = {}
  if not exact and bands > 0 then
    local sets = {}
    for b = 1, bands do sets[b] = KEYS[base + 1 + b] end
    local names = redis.call('SUNION', unpack(sets))
    table.sort(names)
    for _, name in ipairs(names) do
      local value = redis.call('GET', ARGV[A + 2 + s] .. name)
      if value then
        table.insert(near, value)
      else
        for b = 1, bands do redis.call('SREM', sets[b], name) end
      end
    end
  end
  if exact or #near > 0 then any = true end
  found[s] = {exact, near}
end
if any then return found end
return false
"""
# Store: ARGV ttl in ms, band keys per entry, then per entry its value and its frame's SHA-256; KEYS per
# entry its entry key, then its band sets.
_STORE = """
local ttl, bands = ARGV[A + 1], tonumber(ARGV[A + 2])
local entries = (#ARGV - A - 2) / 2
for e = 1, entries do
  local base = K + (e - 1) * (bands + 1)
  redis.call('SET', KEYS[base + 1], ARGV[A + 1 + 2 * e], 'PX', ttl)
  for b = 1, bands do
    redis.call('SADD', KEYS[base + 1 + b], ARGV[A + 2 + 2 * e])
    redis.call('PEXPIRE', KEYS[base + 1 + b], ttl)
  end
end
return false
"""


def _alone(rider_lua: str) -> str:
    """A rider body as a script of its own (no lease keys or arguments before its own)."""
    return f"local K, A = 0, 0\nlocal function rider()\n{rider_lua}\nend\nreturn rider()"


@dataclass(frozen=True, slots=True)
class RidingLookup:
    """A Redis lookup sent with an engine lease's acquire; read its hit once the acquire has run."""

    rider: LeaseRider
    cache: RedisVerdictCache
    scopes: tuple[VerdictScope, ...]
    frame: FrameIdentity

    def hit(self) -> ReusedVerdict | None:
        """The verdict it found (None: nothing, or near candidates none of which passes the rule)."""
        try:
            return self.cache.read(self.scopes, self.frame, self.rider.result)
        except (ValueError, KeyError, TypeError) as exc:
            lookup_failed(exc)
            return None


class RedisVerdictCache:
    """Verdicts shared by every gateway process, in Redis; every key expires ``ttl_s`` after its last write.

    ``modgate:verdict:{scope}:{sha256}`` holds the verdict (JSON); ``modgate:verdict-near:{scope}:d{d}:{band}:
    {value}`` is the set of frames indexed under one pHash band. A band set can name a frame whose verdict
    has expired already: such names are skipped on read and removed.
    """

    def __init__(self, client: aioredis.Redis, ttl_s: float, rule: NearDuplicateRule, *,
                 timeout_s: float = 0.25, prefix: str = "modgate") -> None:
        self.client = client
        self.ttl_s = ttl_s
        self.rule = rule
        self.timeout_s = timeout_s  # a slow Redis costs a keyframe at most this, then counts as a miss
        self.prefix = prefix
        self._lookup_script = client.register_script(_alone(_LOOKUP))
        self._store_script = client.register_script(_alone(_STORE))

    def _entry_prefix(self, scope: VerdictScope) -> str:
        return f"{self.prefix}:verdict:{scope.key}:"

    def _entry_key(self, scope: VerdictScope, sha256: str) -> str:
        return f"{self._entry_prefix(scope)}{sha256}"

    def _band_keys(self, scope: VerdictScope, phash: int) -> list[str]:
        d = self.rule.max_distance
        return [f"{self.prefix}:verdict-near:{scope.key}:d{d}:{index}:{value:x}"
                for index, value in phash_bands(phash, d)]

    def _bands(self) -> int:
        return self.rule.max_distance + 1 if self.rule.enabled else 0

    def _lookup_call(
        self, scopes: Sequence[VerdictScope], frame: FrameIdentity
    ) -> tuple[list[str], list[str | int | float]]:
        """The lookup script's keys and arguments."""
        keys: list[str] = []
        for scope in scopes:
            keys.append(self._entry_key(scope, frame.sha256))
            if self.rule.enabled:
                keys.extend(self._band_keys(scope, frame.looked_up_phash))
        return keys, [len(scopes), self._bands(), *(self._entry_prefix(scope) for scope in scopes)]

    def read(self, scopes: Sequence[VerdictScope], frame: FrameIdentity, found: Any) -> ReusedVerdict | None:
        """The best hit in what the lookup script returned (false/None: nothing under any scope)."""
        if not found:
            return None
        hits: list[ReusedVerdict | None] = []
        for exact, near in found:
            if exact is not None:
                hits.append(ReusedVerdict(StoredVerdict.from_json(exact), "exact", 0))
            else:
                hits.append(closest(frame, [StoredVerdict.from_json(value) for value in near], self.rule))
        return best_hit(hits)

    async def lookup(self, scope: VerdictScope, frame: FrameIdentity) -> ReusedVerdict | None:
        """An exact hit, else the nearest near duplicate, else None (also when Redis fails or is slow)."""
        return await self.lookup_any([scope], frame)

    async def lookup_any(self, scopes: Sequence[VerdictScope], frame: FrameIdentity) -> ReusedVerdict | None:
        """The best verdict for ``frame`` under any of ``scopes`` (:func:`best_hit`), in one command; None
        also when Redis fails or is slow."""
        keys, args = self._lookup_call(scopes, frame)
        try:
            async with asyncio.timeout(self.timeout_s):
                found = await self._lookup_script(keys=keys, args=args)
            return self.read(scopes, frame, found)
        except (RedisError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            lookup_failed(exc)
            return None

    def lookup_rider(self, scopes: Sequence[VerdictScope], frame: FrameIdentity) -> RidingLookup:
        """The lookup as Lua that rides with an engine lease's acquire, withholding the slot when it found
        anything (an exact verdict, or near candidates to check)."""
        keys, args = self._lookup_call(scopes, frame)
        return RidingLookup(LeaseRider(_LOOKUP, keys, args, self.client), self, tuple(scopes), frame)

    def _store_call(
        self, kept: Sequence[tuple[VerdictScope, StoredVerdict]]
    ) -> tuple[list[str], list[str | int | float]]:
        """The store script's keys and arguments."""
        keys: list[str] = []
        args: list[str | int | float] = [max(1, round(self.ttl_s * 1000)), self._bands()]
        for scope, stored in kept:
            keys.append(self._entry_key(scope, stored.sha256))
            if self.rule.enabled:
                keys.extend(self._band_keys(scope, stored.phash))
            args += [stored.to_json(), stored.sha256]
        return keys, args

    async def store(self, scope: VerdictScope, stored: StoredVerdict) -> None:
        """Keep a fresh engine verdict for reuse (a Redis failure is logged, not raised)."""
        await self.store_all([(scope, stored)])

    async def store_all(self, kept: Sequence[tuple[VerdictScope, StoredVerdict]]) -> None:
        """Keep several fresh verdicts, each under its scope, in one command (a Redis failure is logged, not
        raised)."""
        if self.ttl_s <= 0 or not kept:
            return
        keys, args = self._store_call(kept)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._store_script(keys=keys, args=args)
        except (RedisError, TimeoutError) as exc:
            store_failed(exc)

    def store_rider(self, kept: Sequence[tuple[VerdictScope, StoredVerdict]]) -> LeaseRider | None:
        """The store as Lua that rides with an engine lease's release (None: nothing to keep)."""
        if self.ttl_s <= 0 or not kept:
            return None
        keys, args = self._store_call(kept)
        return LeaseRider(_STORE, keys, args, self.client)


def lookup_failed(exc: BaseException) -> None:
    """Log a lookup that Redis did not answer (alone, or riding with a lease's acquire), or that could not
    be read."""
    log.warning("verdict cache lookup failed, treated as a miss: %r", exc)


def store_failed(exc: BaseException) -> None:
    """Log a store that Redis did not take (alone, or riding with a lease's release)."""
    log.warning("verdict cache store failed, the verdict will not be reused: %r", exc)
