"""People sign in to the console as themselves through a real OpenID provider (tests/oidc/provider.mjs):
operators reach the console, reviewers only their own tenants' review queue, and every label names them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from pydantic import ValidationError

from bench.servers import free_port
from cli.embedded import ThreadedServer
from gateway.settings import Settings
from tests.oidc.support import REVIEWERS, queue_frames, through_provider
from tests.support import ADMIN_TOKEN, GatewayFactory

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class Console:
    """A gateway whose console signs people in through the provider, and the test's browsers (httpx
    clients keeping cookies), closed after the test."""

    gateway: ThreadedServer
    opened: list[httpx.Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The gateway's URL."""
        return self.gateway.url

    def browser(self) -> httpx.Client:
        """A new browser, with no cookies yet."""
        self.opened.append(httpx.Client(timeout=15))
        return self.opened[-1]

    def through_provider(self, browser: httpx.Client, login: str) -> httpx.Response:
        """Start a sign-in and go through the provider as ``login``: answers its redirect back here."""
        return through_provider(browser, f"{self.url}/console/oidc/start", login,
                                stop_at=f"{self.url}/console/oidc/callback")

    def sign_in(self, login: str) -> httpx.Client:
        """A browser signed in to the console as ``login`` at the provider."""
        browser = self.browser()
        answer = browser.get(self.through_provider(browser, login).headers["location"])
        assert answer.status_code == 200, answer.text
        home = "/console/review" if login in REVIEWERS else "/console"  # a reviewer's page: the queue
        assert answer.headers["refresh"] == f"0; url={home}?signed_in=1"
        return browser

    def csrf(self, browser: httpx.Client) -> dict[str, str]:
        """The ``X-Modgate-CSRF`` header of this browser's session (read from a console page)."""
        match = re.search(r'name="csrf" value="([^"]+)"', browser.get(f"{self.url}/console").text)
        assert match, "no CSRF token on the page"
        return {"X-Modgate-CSRF": match.group(1)}


@pytest.fixture
def console(oidc_gateway: GatewayFactory, redis_url: str) -> Iterator[Console]:
    """The gateway with its review queue and console sessions in a real Redis, and the test's browsers."""
    opened = Console(oidc_gateway(redis_url=redis_url))
    yield opened
    for browser in opened.opened:
        browser.close()


def test_the_sign_in_page_offers_the_provider_beside_the_admin_token(console: Console) -> None:
    page = httpx.get(f"{console.url}/console").text
    assert 'href="/console/oidc/start"' in page
    assert "Sign in with Test IdP" in page
    assert 'name="token"' in page  # the admin token's form stays


def test_an_operator_signs_in_through_the_provider_and_flips_with_their_name_audited(
    console: Console,
) -> None:
    browser = console.sign_in("olivia")
    page = browser.get(f"{console.url}/console")
    assert page.status_code == 200
    assert "olivia@example.test" in page.text
    version = httpx.get(f"{console.url}/admin/thinking-policy", headers=ADMIN).json()["version"]
    flipped = browser.post(f"{console.url}/console/thinking", data={
        "mode": "off", "reason": "load test window", "version": str(version),
        "csrf": console.csrf(browser)["X-Modgate-CSRF"],
    })
    assert flipped.status_code == 303, flipped.text
    audit = httpx.get(f"{console.url}/admin/audit", headers=ADMIN).json()["data"]
    assert audit[0]["actor"] == "olivia@example.test (oidc:olivia, console)"


def test_a_reviewer_labels_their_tenants_frames_and_the_audit_names_them(console: Console) -> None:
    queue_frames(console.gateway, "tenant-a", 1)
    browser = console.sign_in("rita")
    csrf = console.csrf(browser)
    item = browser.post(f"{console.url}/admin/review/claim", headers=csrf)
    assert item.status_code == 200, item.text
    assert item.json()["tenant"] == "tenant-a"
    assert item.json()["frame"].startswith("data:image/jpeg;base64,")
    done = browser.post(f"{console.url}/admin/review/{item.json()['id']}/label", headers=csrf,
                        json={"action": "allow", "categories": []})
    assert done.status_code == 200, done.text
    assert done.json()["label"]["reviewer"] == "rita@example.test (oidc:rita)"
    audit = httpx.get(f"{console.url}/admin/review/audit", headers=ADMIN).json()["data"]
    assert (audit[0]["reviewer"], audit[0]["item_id"]) == ("rita@example.test (oidc:rita)", item.json()["id"])


def test_a_reviewer_of_tenant_b_cannot_claim_see_or_label_tenant_a_frames(console: Console) -> None:
    queue_frames(console.gateway, "tenant-a", 2)
    queue_frames(console.gateway, "tenant-b", 1, seed=10)
    rita, ravi = console.sign_in("rita"), console.sign_in("ravi")
    rita_csrf, ravi_csrf = console.csrf(rita), console.csrf(ravi)
    held_by_rita = rita.post(f"{console.url}/admin/review/claim", headers=rita_csrf).json()
    assert held_by_rita["tenant"] == "tenant-a"

    first = ravi.post(f"{console.url}/admin/review/claim", headers=ravi_csrf)
    assert first.json()["tenant"] == "tenant-b"
    assert ravi.post(f"{console.url}/admin/review/claim", headers=ravi_csrf).status_code == 204  # a's wait
    assert ravi.get(f"{console.url}/admin/review/queue").json()["tenants"].keys() == {"tenant-b"}
    stolen = ravi.post(f"{console.url}/admin/review/{held_by_rita['id']}/label", headers=ravi_csrf,
                       json={"action": "allow", "categories": []})
    assert (stolen.status_code, stolen.json()["error"]["code"]) == (409, "review_item_gone")
    skipped = ravi.post(f"{console.url}/admin/review/{held_by_rita['id']}/skip", headers=ravi_csrf)
    assert skipped.status_code == 409
    ravi.post(f"{console.url}/admin/review/{first.json()['id']}/label", headers=ravi_csrf,
              json={"action": "allow", "categories": []})
    rita.post(f"{console.url}/admin/review/{held_by_rita['id']}/label", headers=rita_csrf,
              json={"action": "allow", "categories": []})
    seen_by_ravi = ravi.get(f"{console.url}/admin/review/audit").json()["data"]
    assert [entry["tenant"] for entry in seen_by_ravi] == ["tenant-b"]
    assert len(httpx.get(f"{console.url}/admin/review/audit", headers=ADMIN).json()["data"]) == 2


def test_a_reviewer_gets_403_on_admin_routes_and_the_operations_console(console: Console) -> None:
    browser = console.sign_in("rita")
    put = browser.put(f"{console.url}/admin/thinking-policy", json={"default_mode": "off"})
    assert put.status_code == 403
    assert put.json()["error"]["code"] == "reviewer_not_allowed"
    assert set(put.json()["error"]) == {"message", "type", "param", "code"}
    assert browser.get(f"{console.url}/admin/moderation-policy").status_code == 403
    page = browser.get(f"{console.url}/console")
    assert page.status_code == 403
    assert "a reviewer" in page.text
    assert browser.get(f"{console.url}/console/panels").status_code == 403
    flip = browser.post(f"{console.url}/console/thinking",
                        data={"mode": "off", "reason": "nope", "version": "1"})
    assert flip.status_code == 403
    assert httpx.get(f"{console.url}/admin/thinking-policy", headers=ADMIN).json()["default_mode"] != "off"


def test_a_review_change_with_the_session_but_no_csrf_token_is_refused(console: Console) -> None:
    queue_frames(console.gateway, "tenant-a", 1)
    browser = console.sign_in("rita")
    refused = browser.post(f"{console.url}/admin/review/claim")
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "csrf_token_invalid")
    forged = browser.post(f"{console.url}/admin/review/claim", headers={"X-Modgate-CSRF": "forged"})
    assert forged.status_code == 403
    assert browser.get(f"{console.url}/admin/review/queue").json()["tenants"]["tenant-a"]["claimed"] == 0


def test_signing_out_ends_a_reviewers_session(console: Console) -> None:
    browser = console.sign_in("rita")
    csrf = console.csrf(browser)["X-Modgate-CSRF"]
    assert browser.post(f"{console.url}/console/sign-out", data={"csrf": csrf}).status_code == 303
    assert browser.get(f"{console.url}/admin/review/queue").status_code == 401


def test_an_account_without_a_modgate_role_is_refused_and_gets_no_session(console: Console) -> None:
    browser = console.browser()
    back = console.through_provider(browser, "nora")
    answer = browser.get(back.headers["location"])
    assert answer.status_code == 403
    assert "modgate-reviewer" in answer.text
    assert "modgate_console" not in browser.cookies
    assert browser.get(f"{console.url}/admin/review/queue").status_code == 401


def test_a_callback_whose_state_is_not_this_browsers_is_refused(console: Console) -> None:
    victim, attacker = console.browser(), console.browser()
    attackers_answer = console.through_provider(attacker, "olivia")
    victim.get(f"{console.url}/console/oidc/start")  # the victim's own flow cookie, another state
    planted = victim.get(attackers_answer.headers["location"])  # login CSRF: the attacker's code
    assert planted.status_code == 401
    assert "state differs" in planted.text
    assert "modgate_console" not in victim.cookies


def test_a_callback_without_the_flow_cookie_is_refused(console: Console) -> None:
    browser = console.browser()
    back = console.through_provider(browser, "olivia")
    browser.cookies.delete("modgate_oidc_flow")
    assert browser.get(back.headers["location"]).status_code == 400


def test_failed_callbacks_count_toward_the_sign_in_limit_and_then_even_a_good_one_waits(
    oidc_gateway: GatewayFactory, redis_url: str
) -> None:
    gateway = oidc_gateway(redis_url=redis_url, console={"sign_in_max_failures_per_client": 2})
    with httpx.Client(timeout=15) as guesser:
        for guess in ("a", "b"):  # codes guessed without this browser's flow
            refused = guesser.get(f"{gateway.url}/console/oidc/callback",
                                  params={"code": guess, "state": "s"})
            assert refused.status_code == 400
        back = through_provider(guesser, f"{gateway.url}/console/oidc/start", "olivia",
                                stop_at=f"{gateway.url}/console/oidc/callback")
        held = guesser.get(back.headers["location"])  # the provider's real answer, while the limit holds
    assert held.status_code == 429
    assert int(held.headers["retry-after"]) > 0
    assert "modgate_console" not in guesser.cookies


def test_oidc_needs_its_client_its_redirect_base_and_the_admin_token() -> None:
    with pytest.raises(ValidationError, match="CLIENT_ID"):
        Settings(admin_token=ADMIN_TOKEN, oidc={"issuer": "https://id.example.com"})
    with pytest.raises(ValidationError, match="ADMIN_TOKEN"):
        Settings(oidc={"issuer": "https://id.example.com", "client_id": "c",
                       "redirect_base_url": "https://modgate.example.com"})
    with pytest.raises(ValidationError, match="http"):
        Settings(admin_token=ADMIN_TOKEN, oidc={"issuer": "id.example.com", "client_id": "c",
                                                "redirect_base_url": "https://modgate.example.com"})
    assert Settings(admin_token=ADMIN_TOKEN).oidc.issuer is None  # off by default


def test_a_provider_that_does_not_answer_is_said_on_the_sign_in_page(oidc_gateway: GatewayFactory) -> None:
    gateway = oidc_gateway(oidc={"issuer": f"http://127.0.0.1:{free_port()}"})  # nothing listens there
    answer = httpx.get(f"{gateway.url}/console/oidc/start", timeout=30)
    assert answer.status_code == 502
    assert "did not answer (discovery document)" in answer.text
    assert 'name="token"' in answer.text  # the admin token still signs in
