"""The thinking policy document and ``decide``: rules, caller choice, the load rule and its hysteresis."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.policy.rules import (
    LoadRule,
    QueueLoad,
    RequestContext,
    ThinkingPolicy,
    decide,
    policy_changes,
)
from tests.support import FakeClock


def policy(**fields: Any) -> ThinkingPolicy:
    """A policy document validated as an operator's PUT would be."""
    return ThinkingPolicy.model_validate(fields)


def chosen(doc: ThinkingPolicy, under_load: bool = False, **context: Any) -> tuple[str, str]:
    """(mode, rule) for one request."""
    decision = decide(doc, RequestContext(**{"tenant": "t", **context}), under_load=under_load)
    return decision.mode, decision.rule


def test_the_default_policy_thinks_and_says_the_default_chose() -> None:
    assert chosen(ThinkingPolicy()) == ("on", "default")


def test_a_caller_gets_the_mode_it_asks_for_when_the_policy_allows_it() -> None:
    assert chosen(ThinkingPolicy(), requested="off") == ("off", "caller")


def test_a_caller_is_refused_when_caller_choice_is_off() -> None:
    assert chosen(policy(default_mode="off", allow_caller_choice=False), requested="on") == ("off", "default")


def test_a_tenant_rule_pins_its_mode_and_callers_cannot_override_it() -> None:
    doc = policy(rules=[{"name": "bulk", "tenants": ["archive"], "mode": "off"}])
    assert chosen(doc, tenant="archive") == ("off", "rule:bulk")
    assert chosen(doc, tenant="archive", requested="on") == ("off", "rule:bulk")
    assert chosen(doc, tenant="live") == ("on", "default")


def test_a_rule_that_pins_a_mode_may_still_let_callers_choose() -> None:
    doc = policy(rules=[{"name": "bulk", "tenants": ["archive"], "mode": "off", "allow_caller_choice": True}])
    assert chosen(doc, tenant="archive", requested="on") == ("on", "caller")


def test_caller_choice_can_be_granted_to_one_tenant_only() -> None:
    doc = policy(
        default_mode="off",
        allow_caller_choice=False,
        rules=[{"name": "trusted", "tenants": ["trust-and-safety"], "allow_caller_choice": True}],
    )
    assert chosen(doc, tenant="trust-and-safety", requested="on") == ("on", "caller")
    assert chosen(doc, tenant="trust-and-safety") == ("off", "default")
    assert chosen(doc, tenant="ads", requested="on") == ("off", "default")


def test_a_tag_rule_matches_any_of_its_tags() -> None:
    doc = policy(
        default_mode="off", rules=[{"name": "appeals", "tags": ["appeal", "escalation"], "mode": "on"}]
    )
    assert chosen(doc, tags=("live", "escalation")) == ("on", "rule:appeals")
    assert chosen(doc, tags=("live",)) == ("off", "default")


def test_a_priority_rule_matches_within_its_bounds() -> None:
    doc = policy(rules=[{"name": "background", "priority_at_least": 5, "mode": "off"}])
    assert chosen(doc, priority=5) == ("off", "rule:background")
    assert chosen(doc, priority=4) == ("on", "default")


def test_the_first_matching_rule_applies() -> None:
    doc = policy(
        rules=[
            {"name": "urgent", "priority_at_most": -5, "mode": "on"},
            {"name": "bulk", "tenants": ["archive"], "mode": "off"},
        ]
    )
    assert chosen(doc, tenant="archive", priority=-8) == ("on", "rule:urgent")
    assert chosen(doc, tenant="archive", priority=0) == ("off", "rule:bulk")


def test_every_matcher_of_a_rule_must_match() -> None:
    doc = policy(rules=[{"name": "archive-bulk", "tenants": ["archive"], "tags": ["bulk"], "mode": "off"}])
    assert chosen(doc, tenant="archive", tags=("bulk",)) == ("off", "rule:archive-bulk")
    assert chosen(doc, tenant="archive", tags=("live",)) == ("on", "default")
    assert chosen(doc, tenant="other", tags=("bulk",)) == ("on", "default")


def test_the_load_rule_turns_thinking_off_even_for_a_caller_who_asks() -> None:
    assert chosen(ThinkingPolicy(), under_load=True, requested="on") == ("off", "load")


def test_a_rule_may_keep_its_requests_thinking_under_load() -> None:
    doc = policy(rules=[{"name": "appeals", "tags": ["appeal"], "mode": "on", "keep_under_load": True}])
    assert chosen(doc, under_load=True, tags=("appeal",)) == ("on", "rule:appeals")
    assert chosen(doc, under_load=True, tags=("live",)) == ("off", "load")


def test_each_mode_gets_its_output_cap_and_only_thinking_gets_the_reasoning_budget() -> None:
    doc = policy(max_completion_tokens_on=300, max_completion_tokens_off=40, thinking_token_budget=200)
    on = decide(doc, RequestContext(tenant="t", requested="on"))
    off = decide(doc, RequestContext(tenant="t", requested="off"))
    assert (on.max_completion_tokens, on.thinking_token_budget) == (300, 200)
    assert (off.max_completion_tokens, off.thinking_token_budget) == (40, None)


def test_the_decision_names_the_policy_version() -> None:
    assert decide(policy(version=7), RequestContext(tenant="t")).policy_version == 7


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"rules": [{"name": "all", "mode": "off"}]}, "matches every request"),
        ({"rules": [{"name": "idle", "tenants": ["a"]}]}, "changes nothing"),
        (
            {
                "rules": [
                    {"name": "x", "tenants": ["a"], "mode": "on"},
                    {"name": "x", "tags": ["b"], "mode": "off"},
                ]
            },
            "unique",
        ),
        ({"rules": [{"name": "bad name!", "tenants": ["a"], "mode": "on"}]}, "pattern"),
        ({"rules": [{"name": "p", "priority_at_least": 3, "priority_at_most": 1, "mode": "on"}]}, "above"),
        ({"load": {"enabled": True}}, "needs queue_depth_high"),
        ({"load": {"queue_depth_high": 4, "queue_depth_low": 4}}, "below"),
        ({"load": {"queue_wait_ms_high": 500}}, "go together"),
        ({"default_mode": "maybe"}, "default_mode"),
        ({"max_completion_tokens_off": 4}, "max_completion_tokens_off"),
        ({"shadow_share": 1.5}, "shadow_share"),
        ({"thinking": "off"}, "thinking"),
    ],
)
def test_an_invalid_document_is_refused_with_a_reason(fields: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        policy(**fields)


def test_the_content_hash_ignores_bookkeeping_and_follows_what_is_decided() -> None:
    base = policy(default_mode="off")
    bookkept = policy(default_mode="off", version=9, updated_by="x", reason="why")
    assert base.content_hash() == bookkept.content_hash()
    assert base.content_hash() != policy(default_mode="on").content_hash()
    assert base.content_hash() != policy(default_mode="off", load={"window_s": 5}).content_hash()


def test_changes_name_each_field_that_differs_by_its_path() -> None:
    old = policy()
    new = policy(
        default_mode="off",
        load={"enabled": True, "queue_depth_high": 8, "queue_depth_low": 2},
        version=4,
        reason="busy",
    )
    assert policy_changes(old, new) == {
        "default_mode": {"old": "on", "new": "off"},
        "load.enabled": {"old": False, "new": True},
        "load.queue_depth_high": {"old": None, "new": 8},
        "load.queue_depth_low": {"old": None, "new": 2},
    }



def test_the_load_rule_turns_off_above_the_high_mark_and_back_on_only_at_the_low_mark() -> None:
    depth = [0]
    load = QueueLoad(lambda: depth[0])
    rule = LoadRule(enabled=True, queue_depth_high=8, queue_depth_low=2)
    seen = []
    for waiting in (0, 8, 9, 5, 3, 2, 5, 8):
        depth[0] = waiting
        seen.append(load.update(rule))
    assert seen == [False, False, True, True, True, False, False, False]


def test_the_load_rule_reads_the_mean_queue_wait_over_its_window() -> None:
    clock = FakeClock()
    load = QueueLoad(lambda: 0, clock=clock)
    rule = LoadRule(enabled=True, queue_wait_ms_high=500, queue_wait_ms_low=100, window_s=10)
    load.observe_queue_wait(0.9)
    load.observe_queue_wait(0.3)
    assert load.queue_wait_ms(10) == pytest.approx(600)
    assert load.update(rule)
    clock.now += 6
    load.observe_queue_wait(0.0)
    assert load.update(rule)  # (900 + 300 + 0) / 3 = 400 ms: between the marks, still off
    clock.now += 5  # the two long waits leave the window
    assert load.queue_wait_ms(10) == 0
    assert not load.update(rule)


def test_a_disabled_load_rule_never_sheds_and_forgets_its_state() -> None:
    depth = [20]
    load = QueueLoad(lambda: depth[0])
    assert load.update(LoadRule(enabled=True, queue_depth_high=8, queue_depth_low=2))
    assert not load.update(LoadRule(enabled=False, queue_depth_high=8, queue_depth_low=2))
    depth[0] = 5
    assert not load.update(LoadRule(enabled=True, queue_depth_high=8, queue_depth_low=2))


def test_the_verdict_format_is_the_policys_unless_a_caller_who_may_choose_asks() -> None:
    def verdict_format(doc: ThinkingPolicy, **context: Any) -> str:
        return decide(doc, RequestContext(**{"tenant": "t", **context})).verdict_format

    assert verdict_format(ThinkingPolicy()) == "compact"  # the default: a handful of tokens
    assert verdict_format(policy(verdict_format="json")) == "json"
    assert verdict_format(ThinkingPolicy(), requested_format="json") == "json"
    assert verdict_format(policy(allow_caller_choice=False), requested_format="json") == "compact"
    with pytest.raises(ValidationError):
        policy(verdict_format="yaml")


def test_a_format_flip_changes_the_content_hash_and_is_named_in_the_changes() -> None:
    compact, json_form = ThinkingPolicy(), policy(verdict_format="json")
    assert compact.content_hash() != json_form.content_hash()
    assert policy_changes(compact, json_form) == {"verdict_format": {"old": "compact", "new": "json"}}
