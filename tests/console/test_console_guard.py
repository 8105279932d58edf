"""Server-side console guards: failed sign-ins limited (429 + Retry-After), sessions revoked on the server
(sign-out, sign-out everywhere, a rotated admin token), business keys answered 403 on admin routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from cli.embedded import ThreadedServer
from gateway.http.keys_store import API_KEYS_HASH, key_digest
from tests.console.test_console_access import session_cookie, sign_in, signed_in
from tests.support import ADMIN_TOKEN, GatewayFactory

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
OTHER_TOKEN = "another-admin-token-9876543210"


def sign_in_from(gateway: ThreadedServer, address: str, token: str) -> httpx.Response:
    """Post the sign-in form from a loopback address of our choosing (127.0.0.2, 127.0.0.3, …)."""
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(transport=transport, timeout=30) as client:
        return client.post(f"{gateway.url}/console/sign-in", data={"operator": "mallory", "token": token})


def opens_console(gateway: ThreadedServer, cookie: str) -> bool:
    """Whether the cookie still opens the console (the panels answer 200, not 401)."""
    panels = httpx.get(f"{gateway.url}/console/panels", headers={"Cookie": cookie}, timeout=30)
    return panels.status_code == 200


@pytest.fixture
def limited(start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path) -> Any:
    """``limited(per_client, everyone, **settings)``: a console gateway with those sign-in limits."""

    def start(per_client: int, everyone: int, **settings: Any) -> ThreadedServer:
        console = {
            "reports_dir": str(tmp_path / "reports"),
            "sign_in_max_failures_per_client": per_client,
            "sign_in_max_failures": everyone,
            "sign_in_window_s": 600,
        }
        return start_gateway(engine_url=sim.url, console=console, **settings)

    return start


def test_an_address_that_failed_too_often_gets_429_with_retry_after_even_with_the_right_token(
    limited: Any,
) -> None:
    gateway = limited(per_client=3, everyone=100)
    failures = [sign_in_from(gateway, "127.0.0.2", "wrong-token-0123456789").status_code for _ in range(3)]
    assert failures == [401, 401, 401]
    refused = sign_in_from(gateway, "127.0.0.2", ADMIN_TOKEN)
    assert refused.status_code == 429
    assert 0 < int(refused.headers["retry-after"]) <= 600
    assert "set-cookie" not in refused.headers
    assert "Too many failed sign-ins" in refused.text
    assert sign_in_from(gateway, "127.0.0.3", ADMIN_TOKEN).status_code == 303  # another address is not held


def test_failures_from_many_addresses_together_hit_the_limit_for_everyone(limited: Any) -> None:
    gateway = limited(per_client=100, everyone=3)
    for address in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        assert sign_in_from(gateway, address, "wrong-token-0123456789").status_code == 401
    refused = sign_in_from(gateway, "127.0.0.5", ADMIN_TOKEN)
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0


def test_the_sign_in_limit_holds_across_replicas_sharing_redis(limited: Any, redis_url: str) -> None:
    first = limited(per_client=2, everyone=100, redis_url=redis_url)
    second = limited(per_client=2, everyone=100, redis_url=redis_url)
    for _ in range(2):
        assert sign_in_from(first, "127.0.0.2", "wrong-token-0123456789").status_code == 401
    assert sign_in_from(second, "127.0.0.2", ADMIN_TOKEN).status_code == 429


@pytest.fixture(params=["memory", "redis"])
def replicas(request: pytest.FixtureRequest, limited: Any) -> list[ThreadedServer]:
    """One console gateway in memory, or two sharing a real Redis (a session revoked on one is on both)."""
    if request.param == "memory":
        return [limited(per_client=5, everyone=50)]
    redis_url = request.getfixturevalue("redis_url")
    return [limited(per_client=5, everyone=50, redis_url=redis_url) for _ in range(2)]


def test_signing_out_ends_the_session_on_the_server_not_just_the_cookie(
    replicas: list[ThreadedServer],
) -> None:
    cookie, csrf = signed_in(replicas[0])
    copy = cookie  # a copy of the cookie kept elsewhere (another browser, a stolen laptop)
    assert all(opens_console(replica, copy) for replica in replicas)
    signed_out = httpx.post(
        f"{replicas[0].url}/console/sign-out", data={"csrf": csrf}, headers={"Cookie": cookie}
    )
    assert signed_out.status_code == 303
    assert not any(opens_console(replica, copy) for replica in replicas)
    other, _ = signed_in(replicas[-1], "bob")
    assert opens_console(replicas[0], other)  # only that session ended


def test_signing_out_everywhere_ends_every_session_issued_until_then(replicas: list[ThreadedServer]) -> None:
    alice, csrf = signed_in(replicas[0], "alice")
    bob, _ = signed_in(replicas[-1], "bob")
    answer = httpx.post(
        f"{replicas[0].url}/console/sign-out-everywhere", data={"csrf": csrf}, headers={"Cookie": alice}
    )
    assert answer.status_code == 303
    assert not any(opens_console(replica, cookie) for replica in replicas for cookie in (alice, bob))
    again, _ = signed_in(replicas[-1], "alice")  # signing in afterwards works
    assert all(opens_console(replica, again) for replica in replicas)


def test_a_script_signs_everyone_out_with_the_admin_token(replicas: list[ThreadedServer]) -> None:
    cookie, _ = signed_in(replicas[0])
    answer = httpx.post(f"{replicas[-1].url}/console/sign-out-everywhere", headers=ADMIN)
    assert answer.status_code == 200
    assert answer.json()["signed_out_before"] > 0
    assert not opens_console(replicas[0], cookie)


def test_sign_out_everywhere_without_a_csrf_token_changes_nothing(replicas: list[ThreadedServer]) -> None:
    cookie, _ = signed_in(replicas[0])
    refused = httpx.post(f"{replicas[0].url}/console/sign-out-everywhere", headers={"Cookie": cookie})
    assert refused.status_code == 403
    assert opens_console(replicas[-1], cookie)


def test_a_rotated_admin_token_ends_every_session(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, tmp_path: Path
) -> None:
    console = {"reports_dir": str(tmp_path / "reports")}
    before = start_gateway(engine_url=sim.url, redis_url=redis_url, console=console)
    cookie = session_cookie(sign_in(before))
    assert opens_console(before, cookie)
    rotated = start_gateway(engine_url=sim.url, redis_url=redis_url, console=console, admin_token=OTHER_TOKEN)
    assert not opens_console(rotated, cookie)
    page = httpx.get(f"{rotated.url}/console", headers={"Cookie": cookie})
    assert 'id="sign-in-form"' in page.text


def test_a_business_key_held_in_redis_gets_403_on_admin_routes_and_the_console(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, tmp_path: Path
) -> None:
    key = "redis-held-business-key-0123"
    client = redis.Redis.from_url(redis_url)
    client.hset(API_KEYS_HASH, key_digest(key), "acme")
    client.close()
    gateway = start_gateway(
        engine_url=sim.url, redis_url=redis_url, api_keys_from_redis=True,
        console={"reports_dir": str(tmp_path / "reports")},
    )
    business = {"Authorization": f"Bearer {key}"}
    admin = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=business)
    assert admin.status_code == 403
    assert admin.json()["error"]["type"] == "permission_error"
    assert httpx.get(f"{gateway.url}/console/panels", headers=business).status_code == 403
    assert sign_in(gateway, token=key).status_code == 403
    unknown = httpx.get(f"{gateway.url}/admin/thinking-policy", headers={"Authorization": "Bearer nope-0123"})
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (401, "authentication_error")
    assert httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN).status_code == 200
