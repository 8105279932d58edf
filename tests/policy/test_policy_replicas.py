"""Gateway processes on one real Redis: flips spread within a second; a dead Redis stops flips, not serving.

Each gateway is a real ``python -m gateway.cli serve`` process. Tests that stop Redis run their own
``redis-server`` on a free port, so the machine's Redis is never touched.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from bench.servers import free_port, process
from deploy.keyframes import make_keyframe
from gateway.embedded import ThreadedServer
from tests.support import ADMIN_TOKEN, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BUSINESS_KEY = "k-live-0123456"
FLIP_DEADLINE_S = 1.0  # the promise: a flip through one replica is in force on every other within 1 s


def gateway_env(redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of one gateway process on the shared Redis."""
    return {"MODGATE_REDIS_URL": redis_url, "MODGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "MODGATE_API_KEYS": f"{BUSINESS_KEY}:live", **extra}


@contextlib.contextmanager
def gateway_process(engine_url: str, **env: str) -> Iterator[str]:
    """A gateway process, ready once it answers /healthz (readiness may be degraded while Redis is away)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    env = {"MODGATE_ENGINE_URL": engine_url, "MODGATE_LOG_LEVEL": "warning", **env}
    with process(args, f"{url}/healthz", env):
        yield url


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
    return httpx.put(f"{url}/admin/thinking-policy", json=body, headers=ADMIN if headers is None else headers,
                     timeout=10)


def moderation_details(url: str, seed: int = 1) -> dict[str, Any]:
    """The ``modgate`` details of one keyframe moderated by ``url``."""
    body = {"model": "m", "input": image_input(make_keyframe("allow", 320, 180, seed=seed))}
    headers = {"Authorization": f"Bearer {BUSINESS_KEY}"}
    response = httpx.post(f"{url}/v1/moderations", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    details: dict[str, Any] = response.json()["results"][0]["modgate"]
    return details


def within(deadline_s: float, condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail once ``deadline_s`` seconds have passed."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {deadline_s:g} s")
        time.sleep(0.02)


def in_force(url: str, version: int, mode: str) -> bool:
    """The replica shows ``version`` and moderates in ``mode`` under it."""
    if policy_of(url)["version"] != version:
        return False
    details = moderation_details(url, seed=version)
    return (details["policy_version"], details["thinking"]) == (version, mode)


class RedisServer:
    """A ``redis-server`` process of this test's own on a fixed port: stopped and started at will."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("these tests need the redis-server binary (apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="modgate-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        """Start with no persistence (a restart loses every key, the worst case) and wait for PING."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return self
                if time.monotonic() > deadline or self.process.poll() is not None:
                    pytest.fail(f"redis-server on port {self.port} did not start")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Kill it (no shutdown save, no goodbye to clients)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A private redis-server (not started yet), killed after the test."""
    server = RedisServer()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


def test_a_flip_through_one_gateway_is_in_force_on_the_other_within_a_second(
    redis_url: str, sim: ThreadedServer
) -> None:
    # The periodic reload is 60 s away: only the published change can make the deadline.
    env = gateway_env(redis_url, MODGATE_POLICY__RELOAD_INTERVAL_S="60")
    with gateway_process(sim.url, **env) as first, gateway_process(sim.url, **env) as second:
        assert policy_of(second)["version"] == 1
        assert moderation_details(second)["thinking"] == "on"

        flipped = put_policy(first, default_mode="off", reason="evening peak")
        assert flipped.status_code == 200, flipped.text
        within(FLIP_DEADLINE_S, lambda: in_force(second, 2, "off"), "the flip through the first gateway")
        assert moderation_details(second)["thinking_rule"] == "default"

        back = put_policy(second, default_mode="on", reason="peak over")
        assert back.status_code == 200, back.text
        within(FLIP_DEADLINE_S, lambda: in_force(first, 3, "on"), "the flip back through the second gateway")


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer not-the-admin-token-xyz"}, 401),
     ({"Authorization": f"Bearer {BUSINESS_KEY}"}, 403)],
    ids=["no-token", "wrong-token", "business-key"],
)
def test_a_flip_without_the_admin_token_changes_nothing_on_any_gateway(
    redis_url: str, sim: ThreadedServer, headers: dict[str, str], status: int
) -> None:
    env = gateway_env(redis_url)
    with gateway_process(sim.url, **env) as first, gateway_process(sim.url, **env) as second:
        refused = put_policy(first, headers=headers, default_mode="off")
        assert refused.status_code == status, refused.text
        audit = httpx.get(f"{second}/admin/audit", headers=ADMIN, timeout=5).json()["data"]
        assert [entry["action"] for entry in audit] == ["seed"], audit
        for url in (first, second):
            shown = policy_of(url)
            assert (shown["version"], shown["default_mode"]) == (1, "on"), shown
            assert moderation_details(url)["thinking"] == "on"


def test_while_redis_is_down_serving_goes_on_and_flips_are_refused_then_work_again(
    own_redis: RedisServer, sim: ThreadedServer
) -> None:
    own_redis.start()
    env = gateway_env(own_redis.url)
    with gateway_process(sim.url, **env) as first, gateway_process(sim.url, **env) as second:
        assert put_policy(first, default_mode="off", reason="evening peak").status_code == 200
        within(FLIP_DEADLINE_S, lambda: in_force(second, 2, "off"), "the flip before Redis stops")

        own_redis.stop()
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

        own_redis.start()  # empty: no persistence
        responses: list[httpx.Response] = []

        def flip_goes_through() -> bool:
            responses.append(put_policy(second, shadow_share=0.25, reason="Redis is back"))
            assert responses[-1].status_code in (200, 503), responses[-1].text
            return responses[-1].status_code == 200

        within(15, flip_goes_through, "a flip once Redis answers again")
        accepted = responses[-1].json()
        # Redis came back empty: the replicas re-seed what they knew, so the flip lands on version 2's
        # content (thinking off), not on a silently restored default.
        assert (accepted["version"], accepted["default_mode"], accepted["shadow_share"]) == (3, "off", 0.25)
        within(FLIP_DEADLINE_S, lambda: policy_of(first)["shadow_share"] == 0.25,
               "the flip after Redis is back")
        assert policy_of(first)["store"]["available"]


def test_a_gateway_started_while_redis_is_down_serves_and_takes_flips_once_it_is_up(
    own_redis: RedisServer, sim: ThreadedServer
) -> None:
    with gateway_process(sim.url, **gateway_env(own_redis.url)) as url:
        details = moderation_details(url)
        assert (details["thinking"], details["thinking_rule"]) == ("on", "default")
        assert details["policy_version"] == 1
        shown = policy_of(url)
        assert not shown["store"]["available"]
        assert shown["store"]["backend"] == "redis"
        assert put_policy(url, default_mode="off", reason="too early").status_code == 503

        own_redis.start()
        within(15, lambda: put_policy(url, default_mode="off", reason="Redis is up").status_code == 200,
               "a flip once Redis is up")
        assert (policy_of(url)["version"], policy_of(url)["store"]["available"]) == (2, True)
        assert moderation_details(url, seed=3)["thinking"] == "off"
