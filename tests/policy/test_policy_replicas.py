"""Gateway processes on one real Redis: flips spread within a second; a dead Redis stops flips, not serving.

Each gateway is a real ``python -m cli.main serve`` process, ready once it answers /healthz
(readiness may be degraded while Redis is away). Tests that stop Redis run their own ``redis-server`` on a
free port, so the machine's Redis is never touched.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.policy.rules import ThinkingPolicy
from tests.processes import GatewayProcessesFactory, RedisServer, poll
from tests.support import ADMIN_TOKEN, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BUSINESS_KEY = "k-live-0123456"
# A flip reaches the other replicas by Redis pub/sub, in milliseconds (the promise is within 1 s); the test
# only needs it well before the periodic reload (600 s here), so only the published change can make it. A
# wall-clock 1 s failed on a loaded machine, where each poll (a moderation call) alone can take a second.
FLIP_DEADLINE_S = 30.0
RELOAD_INTERVAL_S = "600"


def replicas(
    gateway_processes: GatewayProcessesFactory, count: int, engine_url: str, redis_url: str, **extra: str
) -> list[str]:
    """The URLs of ``count`` gateway processes in front of ``engine_url`` on the shared Redis."""
    env = {
        "MODGATE_ENGINE__URL": engine_url,
        "MODGATE_REDIS__URL": redis_url,
        "MODGATE_AUTH__ADMIN_TOKEN": ADMIN_TOKEN,
        "MODGATE_AUTH__API_KEYS": f"{BUSINESS_KEY}:live",
        **extra,
    }
    return [gateway.url for gateway in gateway_processes(count, "/healthz", **env)]


def policy_of(url: str) -> dict[str, Any]:
    """GET /admin/thinking-policy."""
    response = httpx.get(f"{url}/admin/thinking-policy", headers=ADMIN, timeout=5)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def put_policy(url: str, headers: dict[str, str] | None = None, **fields: Any) -> httpx.Response:
    """PUT the policy in force on ``url`` with ``fields`` changed (and a reason)."""
    current = policy_of(url)
    body = {**current, "reason": "replica test", **fields}
    return httpx.put(
        f"{url}/admin/thinking-policy", json=body, headers=ADMIN if headers is None else headers, timeout=10
    )


def moderation_details(url: str, seed: int = 1) -> dict[str, Any]:
    """The ``modgate`` details of one keyframe moderated by ``url``."""
    body = {"model": "m", "input": image_input(make_keyframe("allow", 320, 180, seed=seed))}
    headers = {"Authorization": f"Bearer {BUSINESS_KEY}"}
    response = httpx.post(f"{url}/v1/moderations", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    details: dict[str, Any] = response.json()["results"][0]["modgate"]
    return details


def within_flip_deadline(condition: Callable[[], Any], what: str) -> None:
    """Poll ``condition`` until it holds; fail once ``FLIP_DEADLINE_S`` has passed (every 20 ms)."""
    poll(condition, FLIP_DEADLINE_S, what, every_s=0.02)


def in_force(url: str, version: int, mode: str) -> bool:
    """The replica shows ``version`` and moderates in ``mode`` under it."""
    if policy_of(url)["version"] != version:
        return False
    details = moderation_details(url, seed=version)
    return (details["policy_version"], details["thinking"]) == (version, mode)


def write_policy(redis_url: str, prefix: str, policy: ThinkingPolicy) -> None:
    """Store ``policy`` under ``prefix`` as a replica's flip would have (document and history)."""
    client = redis.Redis.from_url(redis_url)
    try:
        body = policy.model_dump_json()
        client.hset(prefix, mapping={"version": policy.version, "document": body})
        client.hset(f"{prefix}:history", str(policy.version), body)
    finally:
        client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with no persistence (not started yet), killed after the test."""
    server = RedisServer(tmp_path / "redis", persistent=False)
    yield server
    server.kill()


@pytest.mark.parametrize("leftover", [None, 7], ids=["fresh-redis", "redis-holding-version-7"])
def test_a_flip_through_one_gateway_is_in_force_on_the_other_within_a_second(
    redis_url: str, sim: ThreadedServer, gateway_processes: GatewayProcessesFactory, leftover: int | None
) -> None:
    # A key space of this run's own: nothing another run (or a replica still stopping) wrote is read here.
    prefix = f"test:policy:{secrets.token_hex(4)}"
    if leftover is not None:  # an operator's Redis holds an earlier deployment's versions (thinking off)
        earlier = ThinkingPolicy(version=leftover, default_mode="off", reason="an earlier deployment")
        write_policy(redis_url, prefix, earlier)
    start, mode = (1, "on") if leftover is None else (leftover, "off")
    other = "off" if mode == "on" else "on"
    # The periodic reload is 600 s away: only the published change can make the deadline.
    first, second = replicas(
        gateway_processes, 2, sim.url, redis_url,
        MODGATE_POLICY__RELOAD_INTERVAL_S=RELOAD_INTERVAL_S, MODGATE_POLICY__KEY_PREFIX=prefix,
    )
    assert policy_of(second)["version"] == start
    assert moderation_details(second)["thinking"] == mode

    flipped = put_policy(first, default_mode=other, reason="evening peak")
    assert flipped.status_code == 200, flipped.text
    within_flip_deadline(lambda: in_force(second, start + 1, other), "the flip through the first gateway")
    assert moderation_details(second)["thinking_rule"] == "default"

    back = put_policy(second, default_mode=mode, reason="peak over")
    assert back.status_code == 200, back.text
    within_flip_deadline(lambda: in_force(first, start + 2, mode), "the flip back through the second gateway")


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer not-the-admin-token-xyz"}, 401),
        ({"Authorization": f"Bearer {BUSINESS_KEY}"}, 403),
    ],
    ids=["no-token", "wrong-token", "business-key"],
)
def test_a_flip_without_the_admin_token_changes_nothing_on_any_gateway(
    redis_url: str,
    sim: ThreadedServer,
    gateway_processes: GatewayProcessesFactory,
    headers: dict[str, str],
    status: int,
) -> None:
    first, second = replicas(gateway_processes, 2, sim.url, redis_url)
    refused = put_policy(first, headers=headers, default_mode="off")
    assert refused.status_code == status, refused.text
    audit = httpx.get(f"{second}/admin/audit", headers=ADMIN, timeout=5).json()["data"]
    assert [entry["action"] for entry in audit] == ["seed"], audit
    for url in (first, second):
        shown = policy_of(url)
        assert (shown["version"], shown["default_mode"]) == (1, "on"), shown
        assert moderation_details(url)["thinking"] == "on"


def test_while_redis_is_down_serving_goes_on_and_flips_are_refused_then_work_again(
    own_redis: RedisServer, sim: ThreadedServer, gateway_processes: GatewayProcessesFactory
) -> None:
    own_redis.start()
    first, second = replicas(gateway_processes, 2, sim.url, own_redis.url)
    assert put_policy(first, default_mode="off", reason="evening peak").status_code == 200
    within_flip_deadline(lambda: in_force(second, 2, "off"), "the flip before Redis stops")

    own_redis.kill()
    for url in (first, second):  # serving goes on, under the last policy each replica had
        details = moderation_details(url, seed=21)
        assert (details["thinking"], details["policy_version"]) == ("off", 2)
    refused = put_policy(second, default_mode="on", reason="flip while Redis is down")
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "policy_store_unavailable"
    assert "unreachable" in refused.json()["error"]["message"]
    shown = policy_of(second)
    assert (shown["version"], shown["default_mode"], shown["store"]["available"]) == (2, "off", False)
    assert httpx.get(f"{first}/admin/audit", headers=ADMIN, timeout=5).status_code == 503
    assert moderation_details(second, seed=22)["thinking"] == "off"
    readiness = httpx.get(f"{second}/readyz", timeout=5)
    assert readiness.status_code == 200  # still serving: the policy store does not gate readiness
    assert readiness.json()["status"] == "degraded"
    assert readiness.json()["policy_store"]["available"] is False

    own_redis.start()  # empty: no persistence
    responses: list[httpx.Response] = []

    def flip_goes_through() -> bool:
        responses.append(put_policy(second, shadow_share=0.25, reason="Redis is back"))
        assert responses[-1].status_code in (200, 503), responses[-1].text
        return responses[-1].status_code == 200

    poll(flip_goes_through, 15, "a flip once Redis answers again")
    accepted = responses[-1].json()
    # Redis came back empty: the replicas re-seed what they knew, so the flip lands on version 2's
    # content (thinking off), not on a silently restored default.
    assert (accepted["version"], accepted["default_mode"], accepted["shadow_share"]) == (3, "off", 0.25)
    within_flip_deadline(lambda: policy_of(first)["shadow_share"] == 0.25, "the flip after Redis is back")
    assert policy_of(first)["store"]["available"]
    assert httpx.get(f"{first}/readyz", timeout=5).json()["status"] == "ready"


def test_a_gateway_started_while_redis_is_down_serves_and_takes_flips_once_it_is_up(
    own_redis: RedisServer, sim: ThreadedServer, gateway_processes: GatewayProcessesFactory
) -> None:
    (url,) = replicas(gateway_processes, 1, sim.url, own_redis.url)
    details = moderation_details(url)
    assert (details["thinking"], details["thinking_rule"]) == ("on", "default")
    assert details["policy_version"] == 1
    shown = policy_of(url)
    assert not shown["store"]["available"]
    assert shown["store"]["backend"] == "redis"
    assert put_policy(url, default_mode="off", reason="too early").status_code == 503

    own_redis.start()
    poll(
        lambda: put_policy(url, default_mode="off", reason="Redis is up").status_code == 200,
        15,
        "a flip once Redis is up",
    )
    assert (policy_of(url)["version"], policy_of(url)["store"]["available"]) == (2, True)
    assert moderation_details(url, seed=3)["thinking"] == "off"
