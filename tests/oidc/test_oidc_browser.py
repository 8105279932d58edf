"""OpenID Connect sign-in in headless Chromium, through the real provider's own login and consent pages
(tests/oidc/provider.mjs): an operator lands on the console; a reviewer labels a queued frame of their
tenant from the page with the session cookie and its CSRF token, and the audit trail names them."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Page, expect

from cli.embedded import ThreadedServer
from tests.browser import ARTIFACTS, WatchedPage, chromium_page
from tests.oidc.support import PUBLIC_CLIENT, queue_frames
from tests.support import ADMIN_TOKEN, GatewayFactory

pytestmark = [pytest.mark.browser, pytest.mark.redis]

# What the page runs to claim and label the next item: the API with the session cookie (the browser sends
# it on its own) and the session's CSRF token, read from the page's sign-out form.
CLAIM_AND_LABEL = """async () => {
  const csrf = {"X-Modgate-CSRF": document.querySelector('input[name=csrf]').value};
  const claim = await fetch("/admin/review/claim", {method: "POST", headers: csrf});
  if (claim.status !== 200) return {claim: claim.status};
  const item = await claim.json();
  const label = await fetch(`/admin/review/${item.id}/label`, {
    method: "POST", headers: {...csrf, "Content-Type": "application/json"},
    body: JSON.stringify({action: "allow", categories: []}),
  });
  return {claim: claim.status, tenant: item.tenant, label: label.status, answer: await label.json()};
}"""


@pytest.fixture
def gateway(oidc_gateway: GatewayFactory, redis_url: str) -> ThreadedServer:
    """Signing in with the provider's public client (PKCE alone), sessions and the queue in Redis."""
    return oidc_gateway(redis_url=redis_url, oidc={"client_id": PUBLIC_CLIENT, "client_secret": None})


def sign_in(watched: WatchedPage, gateway: ThreadedServer, login: str, home: str = "/console") -> Page:
    """From the console's sign-in page through the provider's login and consent pages, back to ``home`` (an
    operator's console; a reviewer's page is the review queue).

    The provider's development pages ask for a web font from elsewhere: refused here, so nothing leaves the
    machine, and what the browser said about the provider's pages is not the console's problem."""
    page = watched.page
    page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda route: route.abort())
    page.goto(f"{gateway.url}/console")
    page.screenshot(path=str(ARTIFACTS / "console-oidc-sign-in.png"))
    page.click("#oidc-sign-in")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any")
    page.click("button[type=submit]")
    page.click("button[type=submit]")  # the provider's consent page: Continue
    page.wait_for_url(f"{gateway.url}{home}?signed_in=1")
    page.wait_for_load_state("load")
    watched.problems.clear()
    return page


def test_an_operator_signs_in_in_chromium_and_lands_on_the_console(gateway: ThreadedServer) -> None:
    with chromium_page(1280, 900) as watched:
        page = sign_in(watched, gateway, "olivia")
        expect(page.locator("#policy-mode")).to_have_text("thinking ON")
        expect(page.locator("body")).to_contain_text("olivia@example.test")
        page.screenshot(path=str(ARTIFACTS / "console-oidc-operator.png"))
    assert watched.problems == []


def test_a_reviewer_signs_in_in_chromium_and_labels_a_frame_of_their_tenant(gateway: ThreadedServer) -> None:
    queue_frames(gateway, "tenant-b", 1, seed=20)  # not theirs: never served to them
    queue_frames(gateway, "tenant-a", 1)
    with chromium_page(1280, 900) as watched:
        page = sign_in(watched, gateway, "rita", home="/console/review")
        done = page.evaluate(CLAIM_AND_LABEL)
        again = page.evaluate(CLAIM_AND_LABEL)
    assert (done["claim"], done["tenant"], done["label"]) == (200, "tenant-a", 200), done
    assert done["answer"]["label"]["reviewer"] == "rita@example.test (oidc:rita)"
    assert again == {"claim": 204}  # tenant-b's frame still waits, for someone else
    audit = httpx.get(f"{gateway.url}/admin/review/audit",
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["data"]
    assert [(entry["reviewer"], entry["tenant"]) for entry in audit] == [
        ("rita@example.test (oidc:rita)", "tenant-a")
    ]


def test_a_reviewer_signed_in_through_the_provider_labels_their_tenants_frames_on_the_review_page(
    gateway: ThreadedServer,
) -> None:
    """The reviewer's page as the provider's reviewer of tenant-a sees it: only tenant-a's queue and frames,
    labelled with the keys; the operations console is not theirs (no link; 403)."""
    queue_frames(gateway, "tenant-b", 1, seed=20)  # not theirs: never served to them
    queue_frames(gateway, "tenant-a", 2)
    with chromium_page(1280, 900) as watched:
        page = sign_in(watched, gateway, "rita", home="/console/review")
        expect(page.locator("#queue-tenant-a .depth")).to_have_text("2")
        expect(page.locator("#queue-tenant-b")).to_have_count(0)
        expect(page.locator("#nav-operations")).to_have_count(0)
        labelled = 0
        with page.expect_navigation():
            page.keyboard.press("n")
        while page.locator("#item-frame").count():
            expect(page.locator("#item-frame")).to_have_js_property("complete", True)
            assert "tenant-a" in page.locator("#item-heading").inner_text()
            with page.expect_navigation():
                page.keyboard.press("a")
            labelled += 1
            assert labelled <= 2
        expect(page.locator("#item-heading")).to_have_text("The queue is empty")
        assert page.request.get(f"{gateway.url}/console").status == 403  # not the operations console
    assert labelled == 2
    audit = httpx.get(f"{gateway.url}/admin/review/audit",
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["data"]
    assert sorted((entry["reviewer"], entry["tenant"]) for entry in audit) == [
        ("rita@example.test (oidc:rita, console)", "tenant-a")
    ] * 2
    queued = httpx.get(f"{gateway.url}/admin/review/queue",
                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["tenants"]
    assert {tenant: q["depth"] for tenant, q in queued.items()} == {"tenant-b": 1}
    assert watched.problems == []
