"""The reviewer's page over HTTP: who may see a frame, the CSRF token on every decision, and the 409s a
reviewer meets (an item taken over or labelled by someone else meanwhile) said on the page."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.processes import poll
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

API_KEY = "key-a-0123456789"
CLAIM_TIMEOUT_S = 0.3


def admin(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": who}


def queue_review_frames(gateway: ThreadedServer, count: int, seed: int = 0) -> None:
    """Moderate ``count`` frames the simulator judges ``review``: each is queued."""
    frames = [make_keyframe("review", 320, 180, seed=seed + n) for n in range(count)]
    answer = httpx.post(f"{gateway.url}/v1/moderations", json={"input": image_input(*frames)}, timeout=30,
                        headers={"Authorization": f"Bearer {API_KEY}"})
    assert answer.status_code == 200, answer.text


class Reviewer:
    """A console user over HTTP: the session cookie (set by hand: httpx, like a browser, keeps a Secure
    cookie off plain http) and the CSRF token of the page."""

    def __init__(self, gateway: ThreadedServer, name: str) -> None:
        self.url = gateway.url
        signed = httpx.post(f"{self.url}/console/sign-in", data={"operator": name, "token": ADMIN_TOKEN})
        assert signed.status_code == 303, signed.text
        session = SimpleCookie(signed.headers["set-cookie"])["modgate_console"].value
        self.cookie = {"Cookie": f"modgate_console={session}"}
        match = re.search(r'name="csrf" value="([^"]+)"', self.get("/console/review").text)
        assert match
        self.csrf = match.group(1)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers=self.cookie, timeout=10)

    def post(self, path: str, csrf: str | None = None, **form: str) -> httpx.Response:
        data = {"csrf": self.csrf if csrf is None else csrf, **form}
        return httpx.post(f"{self.url}{path}", data=data, headers=self.cookie, timeout=10)

    def claim(self) -> str:
        """Claim the next item from the page; its id."""
        claimed = self.post("/console/review/next")
        assert claimed.status_code == 303, claimed.text
        match = re.search(r"item=(rev-[0-9a-f]{32})", claimed.headers["location"])
        assert match, claimed.headers["location"]
        return match.group(1)


def queue_figures(gateway: ThreadedServer) -> dict[str, Any]:
    tenants: dict[str, Any] = httpx.get(f"{gateway.url}/admin/review/queue", headers=admin("ops"),
                                        timeout=10).json()["tenants"]
    return tenants


def audit_trail(gateway: ThreadedServer) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = httpx.get(f"{gateway.url}/admin/review/audit", headers=admin("ops"),
                                              timeout=10).json()["data"]
    return entries


@pytest.fixture
def start_reviewed(start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str) -> GatewayFactory:
    """Gateways with their review queue in Redis (``review={...}`` settings)."""

    def start(**review: Any) -> ThreadedServer:
        return start_gateway(engine_url=sim.url, api_keys=f"{API_KEY}:tenant-a", redis_url=redis_url,
                             review=review)

    return start


@pytest.fixture
def reviewed(start_reviewed: GatewayFactory) -> ThreadedServer:
    """A gateway with its review queue in Redis (claims held 300 s: nobody takes one over in a test)."""
    return start_reviewed()


def test_a_frame_is_served_to_a_signed_in_reviewer_only_and_never_cached(reviewed: ThreadedServer) -> None:
    queue_review_frames(reviewed, 1)
    stranger = httpx.get(f"{reviewed.url}/console/review", timeout=10)
    assert stranger.status_code == 200
    assert 'id="sign-in-form"' in stranger.text
    alice = Reviewer(reviewed, "alice")
    item_id = alice.claim()
    frame_path = f"/console/review/{item_id}/frame"

    assert httpx.get(f"{reviewed.url}{frame_path}", timeout=10).status_code == 401
    forged = httpx.get(f"{reviewed.url}{frame_path}", timeout=10,
                       headers={"Cookie": alice.cookie["Cookie"][:-4] + "AAAA"})
    assert forged.status_code == 401
    assert httpx.post(f"{reviewed.url}/console/review/next", timeout=10).status_code == 401

    frame = alice.get(frame_path)
    assert frame.status_code == 200
    assert frame.headers["content-type"] == "image/jpeg"
    assert frame.headers["cache-control"] == "no-store"
    page = alice.get(f"/console/review?item={item_id}")
    assert f'src="{frame_path}"' in page.text
    assert frame.content.startswith(b"\xff\xd8\xff")  # the shaped JPEG itself
    bob = httpx.post(f"{reviewed.url}/admin/review/claim", headers=admin("bob"), timeout=10)
    assert bob.status_code == 204  # alice still holds the only item: the page and frame claimed nothing else

    assert alice.get("/console/review/rev-00000000000000000000000000000000/frame").status_code == 404
    assert alice.get("/console/review/not-an-id/frame").status_code == 404


def test_a_decision_without_the_pages_csrf_token_is_refused_and_records_nothing(
    reviewed: ThreadedServer,
) -> None:
    queue_review_frames(reviewed, 2, seed=10)
    alice = Reviewer(reviewed, "alice")
    refused = alice.post("/console/review/next", csrf="forged")
    assert refused.status_code == 403
    assert queue_figures(reviewed)["tenant-a"]["claimed"] == 0
    item_id = alice.claim()
    decide = f"/console/review/{item_id}/decide"
    assert alice.post(decide, csrf="forged", decision="allow").status_code == 403
    unknown = alice.post(decide, decision="block:weather")
    assert unknown.status_code == 400
    assert "Choose a decision" in unknown.text
    figures = queue_figures(reviewed)["tenant-a"]
    assert (figures["depth"], figures["claimed"]) == (2, 1)
    assert audit_trail(reviewed) == []

    done = alice.post(decide, decision="block:violence")
    assert done.status_code == 303
    assert done.headers["location"].startswith("/console/review?done=block%3Aviolence&item=rev-")
    (entry,) = audit_trail(reviewed)
    assert entry["reviewer"].startswith("alice (admin:")
    assert entry["reviewer"].endswith(", console)")
    assert (entry["item_id"], entry["label"]) == (item_id, {"action": "block", "categories": ["violence"]})


def test_an_item_taken_over_then_labelled_by_someone_else_is_a_clear_409(
    start_reviewed: GatewayFactory,
) -> None:
    reviewed = start_reviewed(claim_timeout_s=CLAIM_TIMEOUT_S)
    queue_review_frames(reviewed, 1, seed=20)
    alice = Reviewer(reviewed, "alice")
    item_id = alice.claim()

    def bob_claims() -> bool:
        claimed = httpx.post(f"{reviewed.url}/admin/review/claim", headers=admin("bob"), timeout=10)
        return claimed.status_code == 200 and claimed.json()["id"] == item_id

    poll(bob_claims, 10, "bob to take over alice's claim once it timed out")
    decide = f"/console/review/{item_id}/decide"
    held = alice.post(decide, decision="allow")
    assert held.status_code == 409
    assert "Another reviewer holds this item now" in error_banner(held)
    stale = alice.get(f"/console/review?item={item_id}")
    assert stale.status_code == 409
    assert "You do not hold review item" in error_banner(stale)
    assert 'id="item-frame"' not in stale.text

    labelled = httpx.post(f"{reviewed.url}/admin/review/{item_id}/label", headers=admin("bob"), timeout=10,
                          json={"action": "block", "categories": ["violence"]})
    assert labelled.status_code == 200, labelled.text
    again = alice.post(decide, decision="allow")
    assert again.status_code == 409
    assert "Someone else labelled this item meanwhile" in error_banner(again)
    assert "review item" in error_banner(again)  # the queue's own words, with the item id
    gone = alice.get(f"/console/review?item={item_id}")
    assert (gone.status_code, "not in the queue" in error_banner(gone)) == (404, True)
    (entry,) = audit_trail(reviewed)
    assert entry["reviewer"].startswith("bob (admin:")


def error_banner(page: httpx.Response) -> str:
    """The text of the page's error banner ("" when it has none)."""
    match = re.search(r'<p class="banner error" role="alert" id="error">([^<]*)</p>', page.text)
    return match.group(1).replace("&#39;", "'") if match else ""

