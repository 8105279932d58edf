"""A gateway killed with ``kill -9`` while reviewers hold items loses none: a new gateway on the same Redis
still has every item, a held one goes to the next reviewer once its claim times out, and labels go on."""

from __future__ import annotations

import httpx
import redis

from deploy.keyframes import make_keyframe
from gateway.review.store_redis import GROUP, RedisReviewStore
from tests.processes import GatewayProcessFactory, poll
from tests.support import ADMIN_TOKEN, SimFactory, image_input

API_KEY = "key-a-0123456789"
FRAMES = 4


def test_review_items_survive_a_gateway_killed_with_claims(
    start_sim: SimFactory, gateway_process: GatewayProcessFactory, redis_url: str
) -> None:
    sim = start_sim()
    env = {
        "MODGATE_ENGINE__URL": sim.url,
        "MODGATE_REDIS__URL": redis_url,
        "MODGATE_AUTH__API_KEYS": f"{API_KEY}:tenant-a",
        "MODGATE_AUTH__ADMIN_TOKEN": ADMIN_TOKEN,
        "MODGATE_REVIEW__CLAIM_TIMEOUT_S": "1",
    }

    def call(url: str, path: str, who: str, json: object = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": who}
        return httpx.post(f"{url}{path}", headers=headers, timeout=30, json=json)

    first = gateway_process(**env)
    frames = [make_keyframe("review", 320, 180, seed=70 + n) for n in range(FRAMES)]
    answer = httpx.post(f"{first.url}/v1/moderations", json={"input": image_input(*frames)},
                        headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert answer.status_code == 200, answer.text
    held = [call(first.url, "/admin/review/claim", "alice").json()["id"] for _ in range(2)]
    first.kill()

    second = gateway_process(**env)
    queue = httpx.get(f"{second.url}/admin/review/queue", timeout=10,
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert queue["tenants"]["tenant-a"]["depth"] == FRAMES
    assert queue["tenants"]["tenant-a"]["claimed"] == 2
    # alice's claims outlived her gateway: still hers (she may label them), until the timeout passes
    done = call(second.url, f"/admin/review/{held[0]}/label", "alice", json={"action": "allow"})
    assert done.status_code == 200, done.text
    seen: list[str] = []

    def bob_claims() -> bool:  # the two never claimed at once, then alice's other once its claim times out
        claimed = call(second.url, "/admin/review/claim", "bob")
        if claimed.status_code == 200:
            seen.append(claimed.json()["id"])
        return len(seen) == FRAMES - 1

    poll(bob_claims, 30, "bob to get every item left", every_s=0.1)
    assert held[1] in seen
    assert held[0] not in seen
    for item_id in seen:
        assert call(second.url, f"/admin/review/{item_id}/label", "bob",
                    json={"action": "block", "categories": ["violence"]}).status_code == 200
    state = redis.Redis.from_url(redis_url)
    stream = RedisReviewStore.stream_key("tenant-a")
    assert state.xlen(stream) == 0
    assert state.xpending(stream, GROUP)["pending"] == 0
    assert not state.keys(RedisReviewStore.item_key("*"))  # no frame kept once labelled
    state.close()
