"""The admin API of the thinking policy, and what each moderation answer says about the mode it used."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from tests.processes import poll
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEYS = "k-archive-0123:archive,k-live-0123:live"


def admin(
    gateway: ThreadedServer,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """One admin call (the admin token unless ``headers`` says otherwise)."""
    return httpx.request(
        method, f"{gateway.url}{path}", json=body, headers=ADMIN if headers is None else headers, timeout=10
    )


def flip(gateway: ThreadedServer, reason: str = "test flip", **fields: Any) -> dict[str, Any]:
    """PUT the policy in force with ``fields`` changed; the gateway's answer."""
    current = admin(gateway, "GET", "/admin/thinking-policy").json()
    response = admin(gateway, "PUT", "/admin/thinking-policy", {**current, **fields, "reason": reason})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def moderated(
    gateway: ThreadedServer, key: str | None = None, seed: int = 1, **options: Any
) -> dict[str, Any]:
    """The ``modgate`` details of one keyframe's result."""
    body: dict[str, Any] = {"model": "m", "input": image_input(make_keyframe("allow", 320, 180, seed=seed))}
    if options:
        body["modgate"] = options
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(f"{gateway.url}/v1/moderations", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    details: dict[str, Any] = response.json()["results"][0]["modgate"]
    return details


@pytest.fixture
def keyed_gateway(start_gateway: GatewayFactory, sim: ThreadedServer) -> ThreadedServer:
    """A gateway with two tenants' keys, in memory."""
    return start_gateway(engine_url=sim.url, api_keys=KEYS)


@pytest.mark.parametrize(
    ("authorization", "status"),
    [(None, 401), ("Bearer not-the-admin-token-xyz", 401), ("Bearer k-live-0123", 403)],
    ids=["no-token", "wrong-token", "business-key"],
)
def test_a_flip_without_the_admin_token_is_refused_and_changes_nothing(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, authorization: str | None, status: int
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS, redis_url=redis_url)
    headers = {"Authorization": authorization} if authorization else {}
    body = {"default_mode": "off", "reason": "not allowed to"}
    refused = admin(gateway, "PUT", "/admin/thinking-policy", body, headers=headers)
    assert refused.status_code == status
    assert refused.json()["error"]["type"] in ("authentication_error", "permission_error")
    assert admin(gateway, "GET", "/admin/thinking-policy", headers=headers).status_code == status
    after = admin(gateway, "GET", "/admin/thinking-policy").json()
    assert (after["version"], after["default_mode"]) == (1, "on")
    audit = admin(gateway, "GET", "/admin/audit").json()["data"]
    assert [entry["action"] for entry in audit] == ["seed"]
    assert moderated(gateway, "k-live-0123")["thinking"] == "on"


def test_a_flip_needs_a_reason(gateway: ThreadedServer) -> None:
    refused = admin(gateway, "PUT", "/admin/thinking-policy", {"default_mode": "off"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "reason"
    assert admin(gateway, "GET", "/admin/thinking-policy").json()["version"] == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"default_mode": "sometimes"}, "default_mode"),
        ({"rules": [{"tenants": ["a"], "mode": "on"}]}, "rules.0.name"),
        ({"thinking": "off"}, "thinking"),
        ({"shadow_share": "0.5"}, "shadow_share"),  # JSON's types, as the OpenAPI document says
    ],
)
def test_an_invalid_policy_is_a_400_naming_the_field(
    gateway: ThreadedServer, body: dict[str, Any], param: str
) -> None:
    refused = admin(gateway, "PUT", "/admin/thinking-policy", {**body, "reason": "try it"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == param
    assert admin(gateway, "GET", "/admin/thinking-policy").json()["version"] == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"load": {"enabled": True, "queue_depth_high": 2, "queue_depth_low": 5}}, "load"),
        ({"rules": [{"name": "r", "tenants": ["a"], "mode": "on"}] * 2}, None),
        ({"rules": [{"name": "r", "priority_at_least": 5, "priority_at_most": 1, "mode": "on"}]}, "rules.0"),
    ],
)
def test_a_policy_breaking_a_rule_between_its_fields_is_a_422(
    gateway: ThreadedServer, body: dict[str, Any], param: str | None
) -> None:
    # valid by the OpenAPI document (no schema compares two fields), refused for what it means
    refused = admin(gateway, "PUT", "/admin/thinking-policy", {**body, "reason": "try it"})
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "unprocessable_request"
    assert refused.json()["error"]["param"] == param
    assert admin(gateway, "GET", "/admin/thinking-policy").json()["version"] == 1


def test_a_flip_made_from_a_stale_version_is_a_409(gateway: ThreadedServer) -> None:
    read_at_v1 = admin(gateway, "GET", "/admin/thinking-policy").json()
    flip(gateway, default_mode="off")
    late_edit = {**read_at_v1, "shadow_share": 0.5, "reason": "late"}
    stale = admin(gateway, "PUT", "/admin/thinking-policy", late_edit)
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "stale_policy_version"
    current = admin(gateway, "GET", "/admin/thinking-policy").json()
    assert (current["version"], current["shadow_share"], current["default_mode"]) == (2, 0.0, "off")


def test_the_document_shows_its_version_hash_and_store(gateway: ThreadedServer) -> None:
    shown = admin(gateway, "GET", "/admin/thinking-policy").json()
    assert (shown["version"], shown["default_mode"]) == (1, "on")
    assert len(shown["content_hash"]) == 16
    assert shown["store"]["backend"] == "memory"
    assert shown["store"]["available"]
    flipped = flip(gateway, default_mode="off")
    assert flipped["changed"]
    assert flipped["content_hash"] != shown["content_hash"]
    again = flip(gateway, default_mode="off")
    assert not again["changed"]
    assert again["version"] == flipped["version"]


def test_each_answer_says_which_mode_and_rule_the_policy_chose(keyed_gateway: ThreadedServer) -> None:
    flip(
        keyed_gateway,
        default_mode="off",
        allow_caller_choice=False,
        rules=[{"name": "archive-thinks", "tenants": ["archive"], "mode": "on"}],
    )
    live = moderated(keyed_gateway, "k-live-0123")
    assert (live["thinking"], live["thinking_rule"], live["policy_version"]) == ("off", "default", 2)
    assert live["reasoning_tokens"] == 0
    refused = moderated(keyed_gateway, "k-live-0123", thinking="on")
    assert (refused["thinking"], refused["thinking_rule"]) == ("off", "default")
    archive = moderated(keyed_gateway, "k-archive-0123")
    assert (archive["thinking"], archive["thinking_rule"]) == ("on", "rule:archive-thinks")
    assert archive["reasoning_tokens"] > 0


def test_a_tag_rule_can_let_callers_choose(keyed_gateway: ThreadedServer) -> None:
    flip(
        keyed_gateway,
        default_mode="off",
        allow_caller_choice=False,
        rules=[{"name": "appeals", "tags": ["appeal"], "allow_caller_choice": True}],
    )
    appeal = moderated(keyed_gateway, "k-live-0123", thinking="on", tags=["appeal"])
    assert (appeal["thinking"], appeal["thinking_rule"]) == ("on", "caller")
    assert moderated(keyed_gateway, "k-live-0123", thinking="on", tags=["feed"])["thinking"] == "off"


def test_the_audit_trail_records_who_when_why_and_the_difference(gateway: ThreadedServer) -> None:
    current = admin(gateway, "GET", "/admin/thinking-policy").json()
    headers = {**ADMIN, "X-Modgate-Operator": "alice"}
    body = {**current, "default_mode": "off", "max_completion_tokens_off": 32, "reason": "evening peak"}
    assert admin(gateway, "PUT", "/admin/thinking-policy", body, headers=headers).status_code == 200
    (entry,) = admin(gateway, "GET", "/admin/audit").json()["data"]
    assert entry["actor"].startswith("alice (admin:")
    assert (entry["action"], entry["reason"], entry["old_version"], entry["new_version"]) == (
        "set",
        "evening peak",
        1,
        2,
    )
    assert entry["changes"] == {
        "default_mode": {"old": "on", "new": "off"},
        "max_completion_tokens_off": {"old": 64, "new": 32},
    }
    assert entry["at"].startswith(time.strftime("%Y-", time.gmtime()))


def test_an_operator_name_that_is_not_a_plain_name_is_a_400(gateway: ThreadedServer) -> None:
    headers = {**ADMIN, "X-Modgate-Operator": "alice <script>"}
    refused = admin(gateway, "GET", "/admin/thinking-policy", headers=headers)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "X-Modgate-Operator"


def test_a_rollback_restores_the_previous_policy_as_a_new_version(gateway: ThreadedServer) -> None:
    flip(gateway, default_mode="off")
    rolled = admin(gateway, "POST", "/admin/thinking-policy/rollback", {"reason": "peak is over"})
    assert rolled.status_code == 200
    assert (rolled.json()["version"], rolled.json()["default_mode"]) == (3, "on")
    history = admin(gateway, "GET", "/admin/thinking-policy/history?limit=10").json()["data"]
    assert [(doc["version"], doc["default_mode"]) for doc in history] == [(3, "on"), (2, "off"), (1, "on")]
    assert admin(gateway, "POST", "/admin/thinking-policy/rollback", {"reason": "x"}).status_code == 400
    missing = admin(gateway, "POST", "/admin/thinking-policy/rollback", {"to_version": 9, "reason": "typo"})
    assert missing.status_code == 404


def queued(gateway: ThreadedServer) -> float:
    """Requests waiting for an engine slot, as /metrics says."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name == "modgate_engine_queued":
            return family.samples[0].value
    raise AssertionError("modgate_engine_queued is missing from /metrics")


def test_the_load_rule_turns_thinking_off_while_the_queue_is_long_and_back_on_after(
    start_gateway: GatewayFactory, start_sim: SimFactory
) -> None:
    # Every engine call held 5 s first: the queue stays put until the shed request has been decided, however
    # slow the machine (with 0.4 s a keyframe it drained before a loaded machine sent the fourth request).
    sim = start_sim(preset="spark", time_scale=0.05, faults=Faults(slow_rate=1.0, slow_s=5.0))
    gateway = start_gateway(engine_url=sim.url, max_inflight=1)
    flip(gateway, load={"enabled": True, "queue_depth_high": 1, "queue_depth_low": 0})
    with ThreadPoolExecutor(max_workers=4) as pool:
        backlog = [pool.submit(moderated, gateway, None, seed) for seed in (11, 12, 13)]
        # One in the engine, two waiting: above the high mark of 1.
        poll(lambda: queued(gateway) >= 2, 30, "the queue to build up", every_s=0.02)
        shedding = pool.submit(moderated, gateway, None, 14)
        # its mode is chosen before it waits for a slot: once it waits, the engine may go back to full speed
        poll(lambda: queued(gateway) >= 3, 30, "the fourth request to wait too", every_s=0.02)
        httpx.post(f"{sim.url}/sim/faults", json={}, timeout=10).raise_for_status()
        shed = shedding.result()
        early = [future.result() for future in backlog]
    assert (shed["thinking"], shed["thinking_rule"]) == ("off", "load")
    assert shed["reasoning_tokens"] == 0
    assert early[0]["thinking_rule"] == "default"
    assert queued(gateway) == 0
    after = moderated(gateway, seed=15)
    assert (after["thinking"], after["thinking_rule"]) == ("on", "default")
