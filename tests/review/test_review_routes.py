"""/admin/review/* over HTTP: review verdicts and an audit sample reach the queue; claims, labels and the
409s a reviewer meets; only the admin token (or a reviewer) gets in."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

API_KEY = "key-a-0123456789"


def admin(name: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return headers if name is None else {**headers, "X-Modgate-Operator": name}


def moderate(gateway: ThreadedServer, *labels: str, seed: int = 0) -> list[dict[str, Any]]:
    frames = [make_keyframe(label, 320, 180, seed=seed + n) for n, label in enumerate(labels)]
    answer = httpx.post(
        f"{gateway.url}/v1/moderations", json={"input": image_input(*frames)},
        headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30,
    )
    assert answer.status_code == 200, answer.text
    results: list[dict[str, Any]] = answer.json()["results"]
    return results


def post(gateway: ThreadedServer, path: str, who: str | None = "alice", **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", headers=admin(who), timeout=10, **kwargs)


@pytest.fixture
def reviewed(start_gateway: GatewayFactory, sim: ThreadedServer) -> ThreadedServer:
    return start_gateway(engine_url=sim.url, api_keys=f"{API_KEY}:tenant-a")


def test_a_review_verdict_is_queued_with_its_shaped_frame(reviewed: ThreadedServer) -> None:
    results = moderate(reviewed, "review", "allow", "block:violence")
    assert [r["modgate"]["action"] for r in results] == ["review", "allow", "block"]
    queue = httpx.get(f"{reviewed.url}/admin/review/queue", headers=admin(), timeout=10).json()
    assert queue["tenants"]["tenant-a"]["depth"] == 1  # only the review verdict (no threshold, no sample)
    claimed = post(reviewed, "/admin/review/claim")
    assert claimed.status_code == 200
    item = claimed.json()
    assert list(item)[:6] == ["id", "tenant", "frame", "action", "categories", "confidence"]
    assert (item["tenant"], item["action"], item["request_id"]) == (
        "tenant-a", "review", results[0]["modgate"]["request_id"]
    )
    assert item["frame"].startswith("data:image/jpeg;base64,")
    assert item["thinking"] == "on"
    assert item["reasoning"]
    assert post(reviewed, "/admin/review/claim", who="bob").status_code == 204  # nothing else waits


def test_a_label_is_answered_once_then_409(reviewed: ThreadedServer) -> None:
    moderate(reviewed, "review")
    item = post(reviewed, "/admin/review/claim").json()
    path = f"/admin/review/{item['id']}/label"
    by_bob = post(reviewed, path, who="bob", json={"action": "allow", "categories": []})
    assert by_bob.status_code == 409
    assert by_bob.json()["error"]["code"] == "review_item_claimed"
    assert set(by_bob.json()["error"]) == {"message", "type", "param", "code"}
    done = post(reviewed, path, json={"action": "block", "categories": ["violence"]})
    assert done.status_code == 200, done.text
    assert done.json()["label"]["reviewer"].startswith("alice (admin:")
    assert done.json()["model"]["action"] == "review"
    assert done.json()["agrees"] is False
    again = post(reviewed, path, json={"action": "allow", "categories": []})
    assert (again.status_code, again.json()["error"]["code"]) == (409, "review_item_labelled")
    assert httpx.get(f"{reviewed.url}/admin/review/queue", headers=admin(), timeout=10).json() == {
        "tenants": {}
    }


def test_an_unknown_item_is_409_and_a_bad_label_is_refused(reviewed: ThreadedServer) -> None:
    moderate(reviewed, "review")
    item = post(reviewed, "/admin/review/claim").json()
    path = f"/admin/review/{item['id']}/label"
    gone = post(reviewed, "/admin/review/rev-00000000000000000000000000000000/label",
                json={"action": "allow", "categories": []})
    assert (gone.status_code, gone.json()["error"]["code"]) == (409, "review_item_gone")
    assert post(reviewed, path, json={"action": "maybe"}).status_code == 400
    assert post(reviewed, path, json={"action": "block", "categories": ["weather"]}).status_code == 400
    no_category = post(reviewed, path, json={"action": "block", "categories": []})
    assert no_category.status_code == 422
    assert post(reviewed, path, json={"action": "allow", "categories": []}).status_code == 200


def test_a_skip_gives_the_item_to_the_next_reviewer(reviewed: ThreadedServer) -> None:
    moderate(reviewed, "review")
    item = post(reviewed, "/admin/review/claim").json()
    assert post(reviewed, "/admin/review/claim", who="bob").status_code == 204
    assert post(reviewed, f"/admin/review/{item['id']}/skip").status_code == 204
    again = post(reviewed, "/admin/review/claim", who="bob")
    assert again.status_code == 200
    assert again.json()["id"] == item["id"]


def test_confident_verdicts_are_sampled_for_audit(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=f"{API_KEY}:tenant-a",
                            review={"audit_sample_rate": 1.0})
    moderate(gateway, "allow", "block:violence", seed=40)
    reasons = []
    while (claimed := post(gateway, "/admin/review/claim")).status_code == 200:
        reasons.append((claimed.json()["action"], claimed.json()["reason"]))
    assert sorted(reasons) == [("allow", "audit"), ("block", "audit")]


def test_only_the_admin_token_reaches_the_queue(reviewed: ThreadedServer) -> None:
    no_token = httpx.post(f"{reviewed.url}/admin/review/claim", timeout=10)
    assert no_token.status_code == 401
    business = httpx.post(f"{reviewed.url}/admin/review/claim", timeout=10,
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert business.status_code == 403


def test_a_tenants_moderation_policy_raises_its_own_audit_rate_and_no_one_elses(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=f"{API_KEY}:tenant-a,key-b-0123456789:tenant-b")
    flip = httpx.put(f"{gateway.url}/admin/moderation-policy", headers=admin(), timeout=10, json={
        "default": {}, "tenants": {"tenant-a": {"audit_sample_rate": 1.0}}, "reason": "audit tenant a",
    })
    assert flip.status_code == 200, flip.text
    moderate(gateway, "allow", "block:violence", seed=60)
    labels = ("allow", "block:violence")
    frames = [make_keyframe(label, 320, 180, seed=70 + n) for n, label in enumerate(labels)]
    other = httpx.post(f"{gateway.url}/v1/moderations", json={"input": image_input(*frames)},
                       headers={"Authorization": "Bearer key-b-0123456789"}, timeout=30)
    assert other.status_code == 200, other.text
    queue = httpx.get(f"{gateway.url}/admin/review/queue", headers=admin(), timeout=10).json()
    assert queue["tenants"]["tenant-a"]["depth"] == 2  # the gateway's rate is 0; the tenant's 1.0: both
    assert "tenant-b" not in queue["tenants"]
