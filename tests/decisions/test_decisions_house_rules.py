"""The house rules on ``POST /v1/decisions``: the tenant's API key and keyframe quota, one row per request in
the decision log (on a real Redis), the route in ``/metrics``, and every engine call counted by purpose."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import redis

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import GatewayFactory

KEYS = "key-a:tenant-a"
FRAME = "data:image/jpeg;base64," + base64.b64encode(make_keyframe("allow", 320, 180, seed=5)).decode()
BODY: dict[str, Any] = {
    "model": "m",
    "input": [{"role": "user", "content": [{"type": "input_image", "image_url": FRAME}]}],
    "questions": [{"type": "predicate", "name": "weapon", "instructions": "A weapon is visible."},
                  {"type": "score", "instructions": "How dark?", "levels": [{"label": "a"}, {"label": "b"}]}],
}


def ask(gateway: ThreadedServer, key: str | None) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{gateway.url}/v1/decisions", json=BODY, headers=headers, timeout=60)


def test_without_a_known_key_the_route_answers_401(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, auth={"api_keys": KEYS})
    assert ask(gateway, None).status_code == 401
    assert ask(gateway, "key-b").status_code == 401
    assert ask(gateway, "key-a").status_code == 200


def test_an_image_counts_against_the_tenants_keyframe_quota(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, auth={"api_keys": KEYS},
                            tenants={"keyframes_per_minute": {"tenant-a": 1}})
    first = ask(gateway, "key-a")
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    refused = ask(gateway, "key-a")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "keyframes_per_minute_exceeded"


def test_each_request_is_one_row_in_the_decision_log_with_its_questions_answers_and_versions(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, auth={"api_keys": KEYS}, redis={"url": redis_url})
    answered = ask(gateway, "key-a").json()
    client = redis.Redis.from_url(redis_url)
    entries = client.xrange("modgate:decisions:questions")
    client.close()
    assert len(entries) == 1
    row = json.loads(entries[0][1][b"row"])
    assert row["tenant"] == "tenant-a"
    assert row["answers"] == answered["answers"]
    assert [q["name"] for q in row["questions"]] == ["weapon", None]
    assert row["model"] == answered["model"]
    assert row["policy_version"] >= 1
    assert row["thinking"] == "off"
    assert len(row["frame_sha256"]) == 1
    assert FRAME not in json.dumps(row)  # the frame itself is never kept


def test_metrics_count_the_route_and_its_engine_calls_by_purpose(gateway: ThreadedServer) -> None:
    assert ask(gateway, None).status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'modgate_requests_total{outcome="ok",route="decisions"} 1.0' in metrics
    calls = [line for line in metrics.splitlines()
             if line.startswith("modgate_engine_calls_total") and 'purpose="decision"' in line]
    assert calls
    assert 'outcome="ok"' in calls[0]
    assert calls[0].endswith(" 2.0")  # one place per question (no shared first tokens)
