"""Which policy a verdict is reused under: the terms of the engine request it came from, never the number.

The version number restarts at 1 when the policy's Redis key is lost while the verdicts survive; a later
"version 2" with other limits must not find the first "version 2"'s verdicts, and the same terms under any
number may (the engine would be asked exactly the same).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis

from deploy.keyframes import make_keyframe
from gateway.moderation.engine_call import engine_options
from gateway.moderation.frame_reuse import made_under, verdict_scope
from gateway.moderation.verdict_cache import (
    FrameIdentity,
    MemoryVerdictCache,
    NearDuplicateRule,
    RedisVerdictCache,
    Reuse,
    ReusedVerdict,
    StoredVerdict,
    VerdictScope,
    best_hit,
)
from gateway.policy.rules import Mode, RequestContext, ThinkingDecision, ThinkingPolicy, decide
from gateway.settings import EngineSettings
from shaping.image import ImageLimits, shape_image
from shaping.tokens import TokenGrid

RULE = NearDuplicateRule(max_distance=4, max_colour_delta=32)
BASE: dict[str, Any] = {"version": 2}  # every policy here is "version 2"
# One other value for every field of the policy's content: each either reaches an engine request or not.
VARIATIONS: dict[str, Any] = {
    "default_mode": "off",
    "allow_caller_choice": False,
    "max_completion_tokens_on": 600,
    "max_completion_tokens_off": 32,
    "thinking_token_budget": 200,
    "shadow_share": 0.5,
    "verdict_format": "json",
    "rules": [{"name": "pin", "tenants": ["t"], "mode": "off"}],
    "load": {"enabled": True, "queue_depth_high": 16, "queue_depth_low": 4},
    "escalation": {"threshold": 0.5, "always_categories": ["violence"]},
    # applied to the model's verdict after it is made (and reused): never part of the engine request
    "moderation": {"tenants": {"t": {"categories": ["violence"], "review_below": 0.9}}},
}
CONTEXTS = [RequestContext(tenant="t", requested=mode) for mode in (None, "on", "off", "escalate")]
SETTINGS = EngineSettings()


def frame_identity() -> FrameIdentity:
    shaped = shape_image(make_keyframe("block:hate", seed=5), ImageLimits(), TokenGrid())
    return FrameIdentity(shaped.sha256, int(shaped.phash, 16), shaped.thumbnail)


FRAME = frame_identity()


def stored(policy_version: int, action: str = "block") -> StoredVerdict:
    return StoredVerdict(
        action=action, categories=("hate",), confidence=0.9, sha256=FRAME.sha256, phash=FRAME.phash,
        thumbnail=FRAME.thumbnail, made_at=1.0, request_id="modr-made-0", policy_version=policy_version,
    )


def policy(**fields: Any) -> ThinkingPolicy:
    return ThinkingPolicy.model_validate({**BASE, **fields})


def scope(decision: ThinkingDecision, tenant: str = "t") -> VerdictScope:
    """Where a frame asked under ``decision`` is looked up."""
    return verdict_scope(tenant, decision, "", "p" * 64, "model-id\x1froot\x1f")


def asks(decision: ThinkingDecision) -> list[ThinkingDecision]:
    """Each engine request a decision can make: escalate's fast ask, and its re-ask."""
    return [decision] if decision.reask is None else [decision, decision.reask]


def test_every_field_of_the_policy_is_varied_below() -> None:
    # a new field must be classified here: does it reach the engine request (then engine_terms names it)?
    assert set(VARIATIONS) == set(ThinkingPolicy().decisive())


@pytest.mark.parametrize("field", sorted(VARIATIONS))
@pytest.mark.parametrize("context", CONTEXTS, ids=lambda c: f"asks-{c.requested}")
def test_the_scope_changes_exactly_when_the_engine_request_does(field: str, context: RequestContext) -> None:
    before, after = decide(policy(), context), decide(policy(**{field: VARIATIONS[field]}), context)
    assert before.policy_version == after.policy_version == 2
    for old, new in zip(asks(before), asks(after), strict=False):
        same_request = (engine_options(old, 1, SETTINGS, model="m", priority=0)
                        == engine_options(new, 1, SETTINGS, model="m", priority=0))
        base = VerdictScope(tenant="t", policy_terms="", thinking="", prompt_sha256="p" * 64)
        assert (made_under(base, old).key == made_under(base, new).key) == same_request, (field, old, new)


def test_the_limits_reach_the_scope_and_the_bookkeeping_does_not() -> None:
    off = RequestContext(tenant="t", requested="off")
    assert scope(decide(policy(), off)) != scope(decide(policy(max_completion_tokens_off=32), off))
    on = RequestContext(tenant="t", requested="on")
    assert scope(decide(policy(), on)) != scope(decide(policy(thinking_token_budget=200), on))
    renumbered = policy(version=7, reason="a no-op flip", updated_by="alice")
    assert scope(decide(policy(), off)) == scope(decide(renumbered, off))


async def test_the_same_number_with_other_content_shares_no_verdict() -> None:
    cache = MemoryVerdictCache(ttl_s=60, max_entries=10, rule=RULE)
    off = RequestContext(tenant="t", requested="off")
    first = decide(policy(max_completion_tokens_off=24), off)  # "version 2" before the key was lost
    second = decide(policy(max_completion_tokens_off=48), off)  # "version 2" after numbering restarted
    await cache.store(scope(first), stored(first.policy_version))
    assert await cache.lookup(scope(second), FRAME) is None
    assert await cache.lookup(scope(first), FRAME) is not None


async def test_the_same_content_under_a_new_number_reuses_and_keeps_the_number_it_was_made_under() -> None:
    cache = MemoryVerdictCache(ttl_s=60, max_entries=10, rule=RULE)
    off = RequestContext(tenant="t", requested="off")
    await cache.store(scope(decide(policy(), off)), stored(2))
    hit = await cache.lookup(scope(decide(policy(version=9, default_mode="escalate"), off)), FRAME)
    assert hit is not None
    assert (hit.reused, hit.stored.policy_version) == ("exact", 2)


def escalate_policy(**fields: Any) -> ThinkingPolicy:
    return policy(default_mode="escalate", allow_caller_choice=True, **fields)


def decision_for(mode: Mode | None, **fields: Any) -> ThinkingDecision:
    return decide(escalate_policy(**fields), RequestContext(tenant="t", requested=mode))


async def test_escalate_reuses_thinking_on_verdicts_made_under_the_re_asks_limits() -> None:
    cache = MemoryVerdictCache(ttl_s=60, max_entries=10, rule=RULE)
    escalate = decision_for(None)
    assert escalate.mode == "escalate"
    await cache.store(scope(decision_for("on")), stored(2))  # a thinking-on caller's verdict
    assert await cache.lookup(scope(escalate), FRAME) is not None
    # the escalation rule decides when to re-ask, not what a re-ask answers: the verdict stays valid
    assert await cache.lookup(scope(decision_for(None, escalation={"threshold": 0.99})), FRAME) is not None
    # other thinking-on limits would ask the engine something else: judged again
    assert await cache.lookup(scope(decision_for(None, max_completion_tokens_on=600)), FRAME) is None
    assert await cache.lookup(scope(decision_for(None, thinking_token_budget=200)), FRAME) is None


async def test_a_fast_verdict_that_stood_is_kept_for_thinking_off_callers_only() -> None:
    cache = MemoryVerdictCache(ttl_s=60, max_entries=10, rule=RULE)
    escalate = decision_for(None)
    base = VerdictScope(tenant="t", policy_terms="", thinking="", prompt_sha256="p" * 64,
                        model="model-id\x1froot\x1f")
    await cache.store(made_under(base, escalate), stored(2, "allow"))  # what verdicts_to_keep does
    assert await cache.lookup(scope(decision_for("off")), FRAME) is not None
    assert await cache.lookup(scope(escalate), FRAME) is None  # escalate looks for a thinking-on verdict
    assert await cache.lookup(scope(decision_for("off", max_completion_tokens_off=32)), FRAME) is None


async def test_an_entry_keyed_by_version_number_before_simply_misses(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    cache = RedisVerdictCache(client, ttl_s=60, rule=RULE, timeout_s=2.0)
    decision = decide(policy(), RequestContext(tenant="t", requested="off"))
    now = scope(decision)
    old_raw = "\x1f".join(("t", "2", now.thinking, now.prompt_sha256, now.text_sha256, now.model,
                           now.verdict_format))  # how the scope was named by version number
    old_key = hashlib.sha256(old_raw.encode()).hexdigest()[:20]
    old_value = json.loads(stored(2).to_json())
    del old_value["policy_version"]  # values written before did not carry it
    await client.set(f"modgate:verdict:{old_key}:{FRAME.sha256}", json.dumps(old_value), px=60_000)
    assert await cache.lookup(now, FRAME) is None
    assert StoredVerdict.from_json(json.dumps(old_value)).policy_version is None  # still readable
    await client.aclose()


def test_a_frame_found_under_several_engines_models_takes_exact_then_nearest_then_the_first_listed() -> None:
    def hit(reused: Reuse, distance: int, request_id: str) -> ReusedVerdict:
        return ReusedVerdict(replace(stored(1, "allow"), request_id=request_id), reused, distance)

    def best(*hits: ReusedVerdict | None) -> str | None:
        found = best_hit(hits)
        return None if found is None else found.stored.request_id

    assert best(None, None) is None
    assert best(hit("near", 1, "first"), hit("exact", 0, "second")) == "second"
    assert best(hit("near", 3, "first"), hit("near", 2, "second")) == "second"
    assert best(hit("near", 2, "first"), None, hit("near", 2, "third")) == "first"
