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
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import RedisError

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
    phash: int
    thumbnail: bytes  # ShapedImage.thumbnail: the shaping step's 16×9 colour cell means


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
        if not self.enabled:
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


class VerdictCache(Protocol):
    """Where reusable verdicts live."""

    rule: NearDuplicateRule

    async def lookup(self, scope: VerdictScope, frame: FrameIdentity) -> ReusedVerdict | None:
        """An exact hit, else the nearest near duplicate, else None."""
        ...

    async def store(self, scope: VerdictScope, stored: StoredVerdict) -> None:
        """Keep a fresh engine verdict for reuse."""
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
        for band in phash_bands(frame.phash, self.rule.max_distance):
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

    def _entry_key(self, scope: VerdictScope, sha256: str) -> str:
        return f"{self.prefix}:verdict:{scope.key}:{sha256}"

    def _band_keys(self, scope: VerdictScope, phash: int) -> list[str]:
        d = self.rule.max_distance
        return [f"{self.prefix}:verdict-near:{scope.key}:d{d}:{index}:{value:x}"
                for index, value in phash_bands(phash, d)]

    async def lookup(self, scope: VerdictScope, frame: FrameIdentity) -> ReusedVerdict | None:
        """An exact hit, else the nearest near duplicate, else None (also when Redis fails or is slow)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._lookup(scope, frame)
        except (RedisError, TimeoutError, ValueError, KeyError) as exc:
            log.warning("verdict cache lookup failed, treated as a miss: %r", exc)
            return None

    async def _lookup(self, scope: VerdictScope, frame: FrameIdentity) -> ReusedVerdict | None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.get(self._entry_key(scope, frame.sha256))
            if self.rule.enabled:
                pipe.sunion(self._band_keys(scope, frame.phash))
            replies = await pipe.execute()
        if replies[0] is not None:
            return ReusedVerdict(StoredVerdict.from_json(replies[0]), "exact", 0)
        if not self.rule.enabled or not replies[1]:
            return None
        names = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in replies[1])
        values = await self.client.mget([self._entry_key(scope, sha) for sha in names])
        candidates = [StoredVerdict.from_json(value) for value in values if value is not None]
        expired = [sha for sha, value in zip(names, values, strict=True) if value is None]
        if expired:
            await self._forget(scope, frame.phash, expired)
        return closest(frame, candidates, self.rule)

    async def _forget(self, scope: VerdictScope, phash: int, expired: list[str]) -> None:
        """Take expired frames out of the band sets this lookup read (others are cleaned when read)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for key in self._band_keys(scope, phash):
                pipe.srem(key, *expired)
            await pipe.execute()

    async def store(self, scope: VerdictScope, stored: StoredVerdict) -> None:
        """Keep a fresh engine verdict for reuse (a Redis failure is logged, not raised)."""
        if self.ttl_s <= 0:
            return
        ttl_ms = max(1, round(self.ttl_s * 1000))
        try:
            async with asyncio.timeout(self.timeout_s), self.client.pipeline(transaction=False) as pipe:
                pipe.set(self._entry_key(scope, stored.sha256), stored.to_json(), px=ttl_ms)
                if self.rule.enabled:
                    for key in self._band_keys(scope, stored.phash):
                        pipe.sadd(key, stored.sha256)
                        pipe.pexpire(key, ttl_ms)
                await pipe.execute()
        except (RedisError, TimeoutError) as exc:
            log.warning("verdict cache store failed, the verdict will not be reused: %r", exc)
