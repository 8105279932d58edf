"""Each tenant's moderation policy: its document, its flips (the thinking policy's store), its verdicts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app
from deploy.keyframes import make_keyframe
from gateway.policy.moderation import ModerationPolicy, apply_moderation_policy
from shaping.verdict import KeyframeVerdict
from tests.processes import RedisServer, poll
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEYS = "k-news-0123:news,k-kids-0123:kids,k-other-0123:other"
FRAMES = [make_keyframe("block:violence", 320, 180, seed=3), make_keyframe("allow", 320, 180, seed=4)]
# A flip is published to the other replicas at once; the deadline only has to beat the periodic reload
# (600 s here), so only the published change can make it (a loaded machine's moderation call can take 1 s).
FLIP_DEADLINE_S = 30.0


def put_moderation(url: str, document: dict[str, Any], reason: str = "tenant onboarding") -> httpx.Response:
    """PUT /admin/moderation-policy with ``document`` and a reason."""
    return httpx.put(f"{url}/admin/moderation-policy", json={**document, "reason": reason}, headers=ADMIN,
                     timeout=10)


def moderation_policy(url: str) -> dict[str, Any]:
    """GET /admin/moderation-policy."""
    response = httpx.get(f"{url}/admin/moderation-policy", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    shown: dict[str, Any] = response.json()
    return shown


def results(url: str, key: str) -> list[Any]:
    """The two frames' results for the tenant of ``key``, through the official client."""
    with openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        return list(client.moderations.create(model="m", input=image_input(*FRAMES)).results)  # type: ignore[arg-type]  # the client types input as its own parts; image parts are dicts


def details(result: Any) -> dict[str, Any]:
    """A result's ``modgate`` field (outside the client's typed model)."""
    extra: dict[str, Any] = result.model_extra["modgate"]
    return extra


# --- the document ---


def test_a_tenant_leaving_a_field_out_takes_the_default() -> None:
    policy = ModerationPolicy.model_validate({
        "default": {"review_below": 0.4, "on_engine_failure": "review"},
        "tenants": {"news": {"categories": ["sexual"], "on_engine_failure": "fail_closed"}},
    })
    news, other = policy.for_tenant("news"), policy.for_tenant("other")
    assert (news.categories, news.review_below) == (frozenset({"sexual"}), 0.4)
    assert news.on_engine_failure == "fail_closed"
    assert other.review_below == 0.4
    assert other.on_engine_failure == "review"
    assert "violence" in other.categories  # the built-in default enforces every category


@pytest.mark.parametrize(
    ("entry", "categories", "expected"),
    [
        ({"review_below": 0.9}, ("violence",), ("review", ("violence",), "review_below")),
        ({"categories": ["violence"]}, ("violence", "hate"),
         ("block", ("violence",), "category_not_enforced")),
        ({"thresholds": {"violence": {"block": 0.99, "review_from": 0.5}}}, ("violence",),
         ("review", ("violence",), "below_block_threshold")),
        ({"thresholds": {"violence": {"block": 0.99, "review_from": 0.95}}}, ("violence",),
         ("allow", (), "below_review_band")),
        # hate has no mark: it still blocks, whatever violence's score
        ({"thresholds": {"violence": {"block": 0.99, "review_from": 0.95}}}, ("violence", "hate"),
         ("block", ("hate",), None)),
        ({"thresholds": {"violence": {"block": 0.7}}}, ("violence",), ("block", ("violence",), None)),
    ],
)
def test_each_rule_changes_a_block_as_it_says(
    entry: dict[str, Any], categories: tuple[str, ...], expected: tuple[str, tuple[str, ...], str | None]
) -> None:
    verdict = KeyframeVerdict(action="block", categories=categories, confidence=0.8,
                              category_scores=(("violence", 0.8), ("hate", 0.2)))
    tenant = ModerationPolicy.model_validate({"tenants": {"t": entry}}).for_tenant("t")
    answered, rule = apply_moderation_policy(verdict, tenant)
    assert (answered.action, answered.categories, rule) == expected


def test_a_block_of_unenforced_categories_only_is_an_allow_and_a_confident_allow_stays() -> None:
    tenant = ModerationPolicy.model_validate({"tenants": {"t": {"categories": ["sexual"]}}}).for_tenant("t")
    blocked = KeyframeVerdict(action="block", categories=("violence",), confidence=0.99)
    assert apply_moderation_policy(blocked, tenant) == (
        KeyframeVerdict(action="allow", categories=(), confidence=0.99), "category_not_enforced"
    )
    allowed = KeyframeVerdict(action="allow", confidence=None)
    assert apply_moderation_policy(allowed, tenant) == (allowed, None)


@pytest.mark.parametrize(
    ("document", "status", "field"),
    [
        ({"tenants": {"news": {"categories": ["gore"]}}}, 422, "categories"),
        ({"tenants": {"news": {"thresholds": {"gore": {"block": 0.5}}}}}, 422, "thresholds"),
        ({"tenants": {"news": {"review_below": 1.5}}}, 400, "review_below"),
        ({"default": {"thresholds": {"violence": {"block": -0.1}}}}, 400, "block"),
        ({"tenants": {"news": {"thresholds": {"violence": {"block": 0.5, "review_from": 0.7}}}}}, 422,
         "review_from"),
        ({"tenants": {"news": {"on_engine_failure": "fail_open"}}}, 400, "on_engine_failure"),
        ({"tenants": {"news": {"blocked": ["violence"]}}}, 400, "blocked"),
    ],
    ids=["unknown-category", "unknown-threshold-category", "above-1", "below-0", "band-above-threshold",
         "unknown-failure-mode", "unknown-field"],
)
def test_a_bad_policy_is_refused_naming_the_field_and_changes_nothing(
    start_gateway: GatewayFactory, sim: ThreadedServer, document: dict[str, Any], status: int, field: str
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    refused = put_moderation(gateway.url, document)
    assert refused.status_code == status, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert field in error["message"]
    assert error["param"].startswith(("tenants.news", "default"))
    assert moderation_policy(gateway.url)["version"] == 1
    audit = httpx.get(f"{gateway.url}/admin/audit", headers=ADMIN, timeout=10).json()["data"]
    assert audit == []


def test_a_flip_is_a_new_version_of_the_one_document_in_its_audit(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    shown = moderation_policy(gateway.url)
    assert (shown["version"], shown["tenants"]) == (1, {})
    assert shown["default"]["on_engine_failure"] == "fail_closed"
    flipped = put_moderation(gateway.url, {"version": 1, "tenants": {"news": {"categories": ["sexual"]}}})
    assert flipped.status_code == 200, flipped.text
    assert (flipped.json()["version"], flipped.json()["changed"]) == (2, True)
    stale = put_moderation(gateway.url, {"version": 1, "tenants": {}})
    assert stale.status_code == 409
    thinking = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN, timeout=10).json()
    assert thinking["version"] == 2  # one version counter
    # a thinking flip sent without the moderation part keeps the moderation policy in force
    thinking.pop("moderation")
    put = httpx.put(f"{gateway.url}/admin/thinking-policy", headers=ADMIN, timeout=10,
                    json={**thinking, "default_mode": "off", "reason": "evening peak"})
    assert put.status_code == 200, put.text
    assert moderation_policy(gateway.url)["tenants"] == {"news": {
        "categories": ["sexual"], "review_below": None, "thresholds": None, "on_engine_failure": None,
        "audit_sample_rate": None,
    }}
    audit = httpx.get(f"{gateway.url}/admin/audit", headers=ADMIN, timeout=10).json()["data"]
    assert [entry["new_version"] for entry in audit] == [3, 2]
    assert audit[1]["reason"] == "tenant onboarding"
    assert "moderation.tenants.news" in audit[1]["changes"]
    assert list(audit[0]["changes"]) == ["default_mode"]


# --- verdicts ---


def test_two_tenants_posting_the_same_frames_get_what_their_policies_say(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS)
    document = {"tenants": {
        "news": {"categories": ["sexual", "sexual/minors"]},  # violence in news clips is allowed
        "kids": {"thresholds": {"violence": {"block": 1.0, "review_from": 0.0}}},  # a human on every one
    }}
    assert put_moderation(gateway.url, document).status_code == 200
    news, kids, other = (results(gateway.url, key) for key in ("k-news-0123", "k-kids-0123", "k-other-0123"))
    assert [details(r)["action"] for r in other] == ["block", "allow"]  # the default: as the model said
    assert [details(r)["action"] for r in news] == ["allow", "allow"]
    assert not news[0].flagged
    assert (details(news[0])["model_action"], details(news[0])["moderation_rule"]) == (
        "block", "category_not_enforced"
    )
    assert [details(r)["action"] for r in kids] == ["review", "allow"]
    assert kids[0].flagged
    assert not kids[0].categories.violence  # a review blocks nothing
    assert details(kids[0])["moderation_rule"] == "below_block_threshold"
    for result in (*news, *kids, *other):
        assert details(result)["moderation_policy_version"] == 2
        assert details(result)["model"]
        assert details(result)["prompt_version"]


def test_review_below_escalates_first_under_escalate(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS)
    thinking = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN, timeout=10).json()
    thinking["escalation"]["threshold"] = 0.0  # escalate re-asks nothing on its own
    httpx.put(f"{gateway.url}/admin/thinking-policy", headers=ADMIN, timeout=10,
              json={**thinking, "default_mode": "escalate", "reason": "escalate"}).raise_for_status()
    assert put_moderation(gateway.url, {"tenants": {"kids": {"review_below": 1.0}}}).status_code == 200
    kids = [details(r) for r in results(gateway.url, "k-kids-0123")]
    other = [details(r) for r in results(gateway.url, "k-other-0123")]
    assert all(d["thinking_rule"] == "escalated" and d["escalated_from"]["threshold"] == 1.0 for d in kids)
    assert all(d["thinking_rule"] != "escalated" for d in other)


@pytest.mark.parametrize("tenant_rule", ["review", "fail_closed"])
def test_an_engine_failure_answers_as_the_tenant_says(
    start_gateway: GatewayFactory, tenant_rule: str
) -> None:
    gateway = start_gateway(engine_url="http://127.0.0.1:9", api_keys=KEYS)  # nothing listens on port 9
    document = {"tenants": {"news": {"on_engine_failure": tenant_rule}}}
    assert put_moderation(gateway.url, document).status_code == 200
    body = {"model": "m", "input": image_input(*FRAMES)}
    answer = httpx.post(f"{gateway.url}/v1/moderations", json=body, timeout=30,
                        headers={"Authorization": "Bearer k-news-0123"})
    if tenant_rule == "fail_closed":
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "server_error"
        return
    assert answer.status_code == 200, answer.text
    found = [result["modgate"] for result in answer.json()["results"]]
    assert [(d["action"], d["engine_failure"]) for d in found] == [("review", "engine_unavailable")] * 2
    other = httpx.post(f"{gateway.url}/v1/moderations", json=body, timeout=30,
                       headers={"Authorization": "Bearer k-other-0123"})
    assert other.status_code == 503  # the default fails closed


# --- replicas on one real Redis ---


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with no persistence (not started yet), killed after the test."""
    server = RedisServer(tmp_path / "redis", persistent=False)
    yield server
    server.kill()


def test_a_flip_reaches_the_other_replica_and_its_audit_and_a_dead_redis_refuses_one(
    start_gateway: GatewayFactory, sim: ThreadedServer, own_redis: RedisServer
) -> None:
    own_redis.start()
    first, second = (
        start_gateway(engine_url=sim.url, api_keys=KEYS, redis_url=own_redis.url,
                      policy={"reload_interval_s": 600})
        for _ in range(2)
    )
    assert [details(r)["action"] for r in results(second.url, "k-news-0123")] == ["block", "allow"]
    document = {"tenants": {"news": {"categories": ["sexual"]}}}
    flipped = put_moderation(first.url, document, reason="news clips")
    assert flipped.status_code == 200, flipped.text
    poll(lambda: moderation_policy(second.url)["version"] == 2, FLIP_DEADLINE_S, "the flip on the second")
    assert [details(r)["action"] for r in results(second.url, "k-news-0123")] == ["allow", "allow"]
    audit = httpx.get(f"{second.url}/admin/audit", headers=ADMIN, timeout=10).json()["data"]
    assert (audit[0]["new_version"], audit[0]["reason"]) == (2, "news clips")

    own_redis.kill()
    refused = put_moderation(second.url, {"tenants": {}}, reason="while Redis is down")
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "policy_store_unavailable"
    for gateway in (first, second):
        shown = moderation_policy(gateway.url)
        assert (shown["version"], list(shown["tenants"])) == (2, ["news"])
    assert [details(r)["action"] for r in results(first.url, "k-news-0123")] == ["allow", "allow"]


def test_stats_show_each_tenant_the_verdicts_its_policy_gave(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS)
    assert put_moderation(gateway.url, {"tenants": {"news": {"categories": ["sexual"]}}}).status_code == 200
    for key in ("k-news-0123", "k-other-0123"):
        results(gateway.url, key)
    rows = {row["tenant"]: row for row in httpx.get(f"{gateway.url}/stats", timeout=10).json()["tenants"]}
    assert rows["news"]["actions"] == {"allow": 2, "review": 0, "block": 0}
    assert rows["news"]["block_share"] == 0.0
    assert rows["other"]["actions"] == {"allow": 1, "review": 0, "block": 1}
    assert rows["other"]["block_share"] == 0.5
    assert rows["kids"]["block_share"] is None  # nothing in the window
    shown = CliRunner().invoke(app, ["stats", "--url", gateway.url])
    assert shown.exit_code == 0, shown.output
    news_line = next(line for line in shown.output.splitlines() if "news" in line)
    assert "0.0 %" in news_line
    other_line = next(line for line in shown.output.splitlines() if "other" in line)
    assert "50.0 %" in other_line
