"""The ``escalate`` mode in the policy: where a mode is taken, its fields, and the per-replica cap."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.policy.rules import (
    EscalationBudget,
    EscalationPolicy,
    RequestContext,
    ThinkingPolicy,
    decide,
    policy_changes,
)
from tests.support import FakeClock


def policy(**fields: Any) -> ThinkingPolicy:
    return ThinkingPolicy.model_validate(fields)



def test_escalate_is_a_default_mode_a_rule_mode_and_a_caller_choice() -> None:
    doc = policy(default_mode="escalate", rules=[{"name": "bulk", "tenants": ["archive"], "mode": "off"}])
    decision = decide(doc, RequestContext(tenant="live"))
    assert (decision.mode, decision.rule) == ("escalate", "default")
    assert decision.max_completion_tokens == doc.max_completion_tokens_off  # the fast ask's cap
    assert decision.thinking_token_budget is None
    assert decision.escalation == doc.escalation
    assert decision.reask is not None
    assert (decision.reask.mode, decision.reask.rule) == ("on", "escalated")
    assert decision.reask.max_completion_tokens == doc.max_completion_tokens_on
    assert decide(doc, RequestContext(tenant="archive")).mode == "off"

    ruled = policy(rules=[{"name": "live", "tags": ["live"], "mode": "escalate"}])
    assert (decide(ruled, RequestContext(tenant="t", tags=("live",))).mode) == "escalate"
    asked = decide(ThinkingPolicy(), RequestContext(tenant="t", requested="escalate"))
    assert (asked.mode, asked.rule) == ("escalate", "caller")
    assert decide(ThinkingPolicy(), RequestContext(tenant="t")).escalation is None


def test_the_load_rule_turns_escalate_off_too() -> None:
    doc = policy(default_mode="escalate", load={"enabled": True, "queue_depth_high": 4, "queue_depth_low": 0})
    decision = decide(doc, RequestContext(tenant="t"), under_load=True)
    assert (decision.mode, decision.rule, decision.reask) == ("off", "load", None)


def test_escalation_fields_are_validated() -> None:
    with pytest.raises(ValidationError, match="unknown gore"):
        EscalationPolicy(always_categories=["gore"])
    with pytest.raises(ValidationError):
        EscalationPolicy(threshold=1.5)
    with pytest.raises(ValidationError):
        EscalationPolicy(max_share=0)
    with pytest.raises(ValidationError):
        policy(default_mode="sometimes")


def test_a_threshold_change_is_a_change_of_content_and_is_diffed() -> None:
    base = policy(default_mode="escalate")
    moved = policy(default_mode="escalate", escalation={"threshold": 0.9})
    assert base.content_hash() != moved.content_hash()
    assert policy_changes(base, moved) == {"escalation.threshold": {"old": 0.85, "new": 0.9}}


def test_the_share_cap_holds_escalations_to_their_share_under_load() -> None:
    clock = FakeClock()
    queued = [3]
    budget = EscalationBudget(lambda: queued[0], clock)
    rule = EscalationPolicy(max_share=0.25, window_s=60, cap_applies="under_load")
    decisions = []
    for _ in range(400):  # every frame unsure: the cap decides
        skipped = budget.skip_reason(rule)
        budget.record(skipped is None)
        decisions.append(skipped)
        clock.now += 0.1
    escalated = sum(reason is None for reason in decisions)
    assert escalated == pytest.approx(100, abs=2)
    assert set(decisions) == {None, "cap_share"}
    assert budget.share(60) == pytest.approx(0.25, abs=0.01)


def test_under_load_only_the_cap_lets_everything_through_while_nobody_waits() -> None:
    clock = FakeClock()
    queued = [0]
    budget = EscalationBudget(lambda: queued[0], clock)
    rule = EscalationPolicy(max_share=0.1, cap_applies="under_load")
    for _ in range(20):
        assert budget.skip_reason(rule) is None
        budget.record(True)
    queued[0] = 1
    assert budget.skip_reason(rule) == "cap_share"
    assert budget.skip_reason(rule.model_copy(update={"cap_applies": "always"})) == "cap_share"


def test_the_rate_cap_counts_the_last_minute() -> None:
    clock = FakeClock()
    budget = EscalationBudget(lambda: 0, clock)
    rule = EscalationPolicy(max_share=None, max_per_minute=5, cap_applies="always")
    for _ in range(5):
        assert budget.skip_reason(rule) is None
        budget.record(True)
        clock.now += 1
    assert budget.skip_reason(rule) == "cap_rate"
    budget.record(False)
    clock.now += 56  # the first escalation leaves the minute
    assert budget.skip_reason(rule) is None
