"""Who may use the console and how: sign-in, the session cookie, CSRF on the flip, a reason for every flip."""

from __future__ import annotations

import base64
import json
import re
import time
from http.cookies import SimpleCookie
from pathlib import Path

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def console(start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path) -> ThreadedServer:
    """A gateway in front of the instant simulator, reading quality reports from an empty directory."""
    return start_gateway(engine_url=sim.url, console={"reports_dir": str(tmp_path / "reports")})


def sign_in(gateway: ThreadedServer, operator: str = "alice", token: str = ADMIN_TOKEN) -> httpx.Response:
    """Post the sign-in form."""
    return httpx.post(f"{gateway.url}/console/sign-in", data={"operator": operator, "token": token})


def session_cookie(response: httpx.Response) -> str:
    """The ``Cookie`` header value for the session the response set.

    Set by hand: httpx, like a browser, would not send a Secure cookie back over plain http.
    """
    morsel = SimpleCookie(response.headers["set-cookie"])["modgate_console"]
    return f"modgate_console={morsel.value}"


def signed_in(gateway: ThreadedServer, operator: str = "alice") -> tuple[str, str]:
    """Sign in; answers the Cookie header and the CSRF token of the console page."""
    cookie = session_cookie(sign_in(gateway, operator))
    page = httpx.get(f"{gateway.url}/console", headers={"Cookie": cookie})
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match, page.text
    return cookie, match.group(1)


def policy(gateway: ThreadedServer) -> dict[str, object]:
    """The policy document in force, read through the admin API."""
    document: dict[str, object] = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN).json()
    return document


def flip(gateway: ThreadedServer, cookie: str | None, **form: str) -> httpx.Response:
    """Post the flip form (with the session cookie, if given)."""
    headers = {"Cookie": cookie} if cookie else {}
    return httpx.post(f"{gateway.url}/console/thinking", data=form, headers=headers)


def test_signing_in_sets_a_signed_httponly_strict_secure_cookie_without_the_token(
    console: ThreadedServer,
) -> None:
    response = sign_in(console)
    assert response.status_code == 303
    assert response.headers["location"] == "/console?signed_in=1"
    set_cookie = response.headers["set-cookie"]
    morsel = SimpleCookie(set_cookie)["modgate_console"]
    assert morsel["httponly"] is True
    assert morsel["secure"] is True
    assert morsel["samesite"].lower() == "strict"
    assert morsel["path"] == "/"  # the review queue's API (/admin/review/*) takes the session too
    assert ADMIN_TOKEN not in set_cookie
    version, payload, signature = morsel.value.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert (version, claims["op"]) == ("v1", "alice")
    assert ADMIN_TOKEN not in json.dumps(claims)
    assert len(signature) == 43  # an HMAC-SHA256, base64url without padding


def test_the_session_cookie_opens_the_console(console: ThreadedServer) -> None:
    cookie = session_cookie(sign_in(console))
    page = httpx.get(f"{console.url}/console", headers={"Cookie": cookie})
    assert page.status_code == 200
    assert 'id="policy-mode"' in page.text
    assert "signed in as <strong>alice</strong>" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"


def test_without_a_session_the_console_shows_only_the_sign_in_form(console: ThreadedServer) -> None:
    page = httpx.get(f"{console.url}/console")
    assert page.status_code == 200
    assert 'id="sign-in-form"' in page.text
    assert 'id="policy-mode"' not in page.text


def test_a_wrong_token_is_refused_without_a_cookie(console: ThreadedServer) -> None:
    response = sign_in(console, token="not-the-admin-token-at-all")
    assert response.status_code == 401
    assert "set-cookie" not in response.headers
    assert "not the admin token" in response.text


def test_a_sign_in_needs_an_operator_name_for_the_audit_trail(console: ThreadedServer) -> None:
    response = sign_in(console, operator="alice; drop")
    assert response.status_code == 400
    assert "set-cookie" not in response.headers


def test_a_session_cookie_with_an_altered_operator_is_not_accepted(console: ThreadedServer) -> None:
    cookie = session_cookie(sign_in(console, "alice"))
    version, payload, signature = cookie.removeprefix("modgate_console=").split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**claims, "op": "mallory"}).encode()).decode().rstrip("=")
    forged_cookie = f"modgate_console={version}.{forged}.{signature}"
    page = httpx.get(f"{console.url}/console", headers={"Cookie": forged_cookie})
    assert 'id="sign-in-form"' in page.text
    assert "mallory" not in page.text


def test_the_bearer_admin_token_opens_the_console_and_flips_without_a_csrf_token(
    console: ThreadedServer,
) -> None:
    page = httpx.get(f"{console.url}/console", headers={**ADMIN, "X-Modgate-Operator": "ci-bot"})
    assert page.status_code == 200
    assert 'id="policy-mode"' in page.text
    response = httpx.post(
        f"{console.url}/console/thinking",
        headers={**ADMIN, "X-Modgate-Operator": "ci-bot"},
        data={"mode": "off", "reason": "nightly drill", "version": "1"},
    )
    assert response.status_code == 303
    document = policy(console)
    assert document["default_mode"] == "off"
    assert str(document["updated_by"]).startswith("ci-bot (admin:")


def test_a_wrong_bearer_token_is_a_401(console: ThreadedServer) -> None:
    response = httpx.get(f"{console.url}/console", headers={"Authorization": "Bearer wrong-token-0123456789"})
    assert response.status_code == 401


def test_a_flip_without_the_csrf_token_is_refused_and_changes_nothing(console: ThreadedServer) -> None:
    cookie, _ = signed_in(console)
    response = flip(console, cookie, mode="off", reason="peak hour", version="1")
    assert response.status_code == 403
    assert "did not come from this console session" in response.text
    assert policy(console)["default_mode"] == "on"
    assert policy(console)["version"] == 1


def test_a_csrf_token_from_another_session_is_refused(console: ThreadedServer) -> None:
    cookie, _ = signed_in(console, "alice")
    _, bobs_csrf = signed_in(console, "bob")
    response = flip(console, cookie, mode="off", reason="peak hour", version="1", csrf=bobs_csrf)
    assert response.status_code == 403
    assert policy(console)["default_mode"] == "on"


def test_a_flip_without_a_reason_is_refused_and_changes_nothing(console: ThreadedServer) -> None:
    cookie, csrf = signed_in(console)
    for reason in ("", "  ", "ok"):
        response = flip(console, cookie, mode="off", reason=reason, version="1", csrf=csrf)
        assert response.status_code == 400
        assert "A reason" in response.text
    assert policy(console)["default_mode"] == "on"
    audit = httpx.get(f"{console.url}/admin/audit", headers=ADMIN).json()["data"]
    assert audit == []


def test_a_flip_with_a_reason_is_audited_with_the_signed_in_operator(console: ThreadedServer) -> None:
    cookie, csrf = signed_in(console, "alice")
    response = flip(console, cookie, mode="off", reason="evening peak", version="1", csrf=csrf)
    assert response.status_code == 303
    assert response.headers["location"] == "/console?flipped=2"
    document = policy(console)
    assert (document["default_mode"], document["version"], document["reason"]) == ("off", 2, "evening peak")
    (entry,) = httpx.get(f"{console.url}/admin/audit", headers=ADMIN).json()["data"]
    assert entry["actor"].startswith("alice (admin:")
    assert entry["actor"].endswith(", console)")
    assert entry["changes"] == {"default_mode": {"old": "on", "new": "off"}}
    page = httpx.get(f"{console.url}/console?flipped=2", headers={"Cookie": cookie})
    assert "Version 2 is in force: thinking OFF" in page.text


def test_a_flip_made_from_a_stale_page_gets_409_and_changes_nothing(console: ThreadedServer) -> None:
    cookie, csrf = signed_in(console)
    assert flip(console, cookie, mode="off", reason="first flip", version="1", csrf=csrf).status_code == 303
    response = flip(console, cookie, mode="on", reason="flip from an old page", version="1", csrf=csrf)
    assert response.status_code == 409
    assert "Not changed" in response.text
    assert 'value="flip from an old page"' in response.text  # the reason stays typed
    assert policy(console)["version"] == 2


def test_a_flip_to_the_mode_in_force_changes_nothing(console: ThreadedServer) -> None:
    cookie, csrf = signed_in(console)
    response = flip(console, cookie, mode="on", reason="just checking", version="1", csrf=csrf)
    assert response.status_code == 303
    assert response.headers["location"] == "/console?unchanged=1"
    assert policy(console)["version"] == 1


def test_a_flip_without_a_session_is_refused(console: ThreadedServer) -> None:
    response = flip(console, None, mode="off", reason="peak hour", version="1")
    assert response.status_code == 401
    assert policy(console)["default_mode"] == "on"


def test_the_polled_panels_need_a_session(console: ThreadedServer) -> None:
    assert httpx.get(f"{console.url}/console/panels").status_code == 401
    cookie, _ = signed_in(console)
    panels = httpx.get(f"{console.url}/console/panels", headers={"Cookie": cookie})
    assert panels.status_code == 200
    body = panels.json()
    assert body["policy_version"] == 1
    assert set(body["panels"]) == {"summary", "policy", "figures", "tenants", "health", "quality", "audit"}


def test_the_panels_show_the_recent_window_figures(console: ThreadedServer) -> None:
    frame = make_keyframe("allow", 320, 180, seed=7)
    answer = httpx.post(f"{console.url}/v1/moderations", json={"model": "m", "input": image_input(frame)})
    assert answer.status_code == 200
    figures = httpx.get(f"{console.url}/console/panels", headers=ADMIN).json()["panels"]["figures"]
    assert re.search(r'id="fig-keyframes">1 \(', figures), figures
    assert re.search(r'id="fig-thinking">100 %', figures), figures
    health = httpx.get(f"{console.url}/console/panels", headers=ADMIN).json()["panels"]["health"]
    assert re.search(r'id="health-ready">yes', health), health


def test_the_panels_name_a_llamacpp_engine_and_its_token_by_token_cache(
    start_gateway: GatewayFactory, start_sim: SimFactory, tmp_path: Path
) -> None:
    sim = start_sim("instant", kind="llamacpp")
    gateway = start_gateway(
        engine_url=sim.url,
        console={"reports_dir": str(tmp_path)},
        telemetry={"engine_scrape_interval_s": 0.05},
    )
    frame = make_keyframe("allow", 320, 180, seed=8)
    assert httpx.post(f"{gateway.url}/v1/moderations", json={"input": image_input(frame)}).status_code == 200
    deadline = time.monotonic() + 10
    while httpx.get(f"{gateway.url}/stats").json()["cache"]["engine_kind"] is None:
        assert time.monotonic() < deadline, "the engine's /metrics was never scraped"
        time.sleep(0.05)
    panels = httpx.get(f"{gateway.url}/console/panels", headers=ADMIN).json()["panels"]
    assert "llama.cpp, token by token" in panels["figures"], panels["figures"]
    assert re.search(r"<td>llama\.cpp</td>", panels["health"]), panels["health"]


def test_signing_out_clears_the_cookie(console: ThreadedServer) -> None:
    cookie, csrf = signed_in(console)
    response = httpx.post(f"{console.url}/console/sign-out", data={"csrf": csrf}, headers={"Cookie": cookie})
    assert response.status_code == 303
    morsel = SimpleCookie(response.headers["set-cookie"])["modgate_console"]
    assert (morsel.value, morsel["max-age"]) == ("", "0")


def test_the_console_is_off_without_an_admin_token(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, admin_token=None)
    page = httpx.get(f"{gateway.url}/console")
    assert page.status_code == 403
    assert "MODGATE_AUTH__ADMIN_TOKEN" in page.text
    assert sign_in(gateway).status_code == 403


def test_the_page_loads_only_its_own_assets(console: ThreadedServer) -> None:
    page = httpx.get(f"{console.url}/console", headers=ADMIN).text
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sources
    assert all(source == "/console" or source.startswith("/console/") for source in sources), sources
    for asset in ("console.css", "console.js", "review.js", "favicon.svg"):
        assert httpx.get(f"{console.url}/console/assets/{asset}").status_code == 200
    assert httpx.get(f"{console.url}/console/assets/..%2Fapp.py").status_code == 404


@pytest.mark.redis
def test_a_console_flip_reaches_another_replica_through_redis(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, tmp_path: Path
) -> None:
    replicas = [
        start_gateway(engine_url=sim.url, redis_url=redis_url, console={"reports_dir": str(tmp_path)})
        for _ in range(2)
    ]
    cookie, csrf = signed_in(replicas[0])
    flipped = flip(replicas[0], cookie, mode="off", reason="shared flip", version="1", csrf=csrf)
    assert flipped.status_code == 303
    deadline = time.monotonic() + 10
    while policy(replicas[1])["default_mode"] != "off":
        assert time.monotonic() < deadline, "the other replica never saw the flip"
        time.sleep(0.05)
    # The session is valid on every replica that shares the admin token.
    page = httpx.get(f"{replicas[1].url}/console", headers={"Cookie": cookie})
    assert "shared flip" in page.text


def test_the_panels_say_when_the_engine_is_down(start_gateway: GatewayFactory, tmp_path: Path) -> None:
    # The discard port: nothing listens there.
    gateway = start_gateway(engine_url="http://127.0.0.1:9", console={"reports_dir": str(tmp_path)})
    panels = httpx.get(f"{gateway.url}/console/panels", headers=ADMIN).json()["panels"]
    assert re.search(r'id="health-ready">no', panels["health"]), panels["health"]
    assert "no answer" in panels["health"]
    assert ">Down<" in panels["summary"]
