"""The verdict cache's stores and near-duplicate rule, without a gateway: memory and a real Redis."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from deploy.keyframes import make_keyframe
from gateway.moderation.verdict_cache import (
    FrameIdentity,
    MemoryVerdictCache,
    NearDuplicateRule,
    RedisVerdictCache,
    StoredVerdict,
    VerdictCache,
    VerdictScope,
    colour_delta,
    hamming,
    phash_bands,
)
from shaping.image import ImageLimits, shape_image
from shaping.tokens import TokenGrid

SCOPE = VerdictScope(tenant="t", policy_terms="a" * 16, thinking="off", prompt_sha256="p" * 64)
RULE = NearDuplicateRule(max_distance=4, max_colour_delta=32)


def identity(frame: bytes) -> FrameIdentity:
    shaped = shape_image(frame, ImageLimits(), TokenGrid())
    return FrameIdentity(shaped.sha256, int(shaped.phash, 16), shaped.thumbnail)


SCENE = identity(make_keyframe("allow", seed=21))
REENCODED = identity(make_keyframe("allow", seed=21, quality=70))  # other bytes, the same picture


def stored(frame: FrameIdentity, action: str = "allow", made_at: float = 1.0) -> StoredVerdict:
    return StoredVerdict(
        action=action,
        categories=(),
        confidence=0.9,
        sha256=frame.sha256,
        phash=frame.phash,
        thumbnail=frame.thumbnail,
        made_at=made_at,
        request_id="modr-x-0",
    )


@pytest.fixture(params=["memory", "redis"])
async def cache(request: pytest.FixtureRequest) -> AsyncIterator[VerdictCache]:
    if request.param == "memory":
        yield MemoryVerdictCache(ttl_s=60, max_entries=100, rule=RULE)
        return
    client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield RedisVerdictCache(client, ttl_s=60, rule=RULE, timeout_s=2.0)
    await client.aclose()


@given(a=st.integers(0, 2**64 - 1), flips=st.sets(st.integers(0, 63), max_size=4), d=st.integers(0, 8))
def test_hashes_within_the_distance_share_a_band(a: int, flips: set[int], d: int) -> None:
    b = a
    for bit in list(flips)[:d]:
        b ^= 1 << bit
    assert hamming(a, b) <= d
    assert set(phash_bands(a, d)) & set(phash_bands(b, d))


def test_the_bands_cover_all_64_bits_once() -> None:
    for d in range(17):
        widths = [value.bit_length() for _, value in phash_bands(2**64 - 1, d)]
        assert sum(widths) == 64
        assert len(widths) == d + 1


def test_the_colour_thumbnail_sees_what_the_grey_phash_does_not() -> None:
    scene, marked = SCENE, identity(make_keyframe("block:violence", seed=21))
    assert hamming(scene.phash, marked.phash) <= RULE.max_distance  # pHash alone would call them the same
    assert colour_delta(scene.thumbnail, marked.thumbnail) > 100
    assert RULE.matches(marked, scene) is None
    assert RULE.matches(REENCODED, scene) is not None


async def test_an_exact_hit_beats_a_near_one(cache: VerdictCache) -> None:
    scene, reencoded = SCENE, REENCODED
    await cache.store(SCOPE, stored(reencoded, "review"))
    await cache.store(SCOPE, stored(scene, "allow"))
    hit = await cache.lookup(SCOPE, scene)
    assert hit is not None
    assert (hit.reused, hit.distance, hit.stored.action) == ("exact", 0, "allow")


async def test_a_near_hit_needs_the_same_scope(cache: VerdictCache) -> None:
    scene, reencoded = SCENE, REENCODED
    await cache.store(SCOPE, stored(scene))
    near = await cache.lookup(SCOPE, reencoded)
    assert near is not None
    assert near.reused == "near"
    assert near.stored.sha256 == scene.sha256
    other = VerdictScope(tenant="t", policy_terms="b" * 16, thinking="off", prompt_sha256="p" * 64)
    assert await cache.lookup(other, reencoded) is None


async def test_an_unrelated_frame_misses(cache: VerdictCache) -> None:
    await cache.store(SCOPE, stored(SCENE))
    assert await cache.lookup(SCOPE, identity(make_keyframe("allow", seed=99))) is None


async def test_memory_evicts_the_least_recently_used_beyond_its_size() -> None:
    memory = MemoryVerdictCache(ttl_s=60, max_entries=3, rule=RULE)
    rng = random.Random(0)
    frames = [FrameIdentity(f"{i:064x}", rng.getrandbits(64), b"") for i in range(5)]
    for frame in frames[:3]:
        await memory.store(SCOPE, stored(frame))
    assert await memory.lookup(SCOPE, frames[0]) is not None  # now the most recently used
    for frame in frames[3:]:
        await memory.store(SCOPE, stored(frame))
    assert len(memory) == 3
    assert await memory.lookup(SCOPE, frames[1]) is None
    assert await memory.lookup(SCOPE, frames[0]) is not None


async def test_an_unreachable_redis_is_a_miss_not_an_error() -> None:
    client = aioredis.Redis(host="127.0.0.1", port=9, socket_connect_timeout=0.2)
    dead = RedisVerdictCache(client, ttl_s=60, rule=RULE, timeout_s=1.0)
    await dead.store(SCOPE, stored(SCENE))
    assert await dead.lookup(SCOPE, SCENE) is None
    await client.aclose()


async def test_redis_forgets_band_members_whose_verdict_expired(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    cache = RedisVerdictCache(client, ttl_s=60, rule=RULE, timeout_s=2.0)
    scene, reencoded = SCENE, REENCODED
    await cache.store(SCOPE, stored(scene))
    await client.delete(f"modgate:verdict:{SCOPE.key}:{scene.sha256}")  # as if its TTL had passed
    assert await cache.lookup(SCOPE, reencoded) is None
    members = [await client.smembers(key) async for key in client.scan_iter("modgate:verdict-near:*")]
    assert all(not found for found in members)
    await client.aclose()
