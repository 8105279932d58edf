"""Repeated keyframes reuse a verdict made in the same scope: in memory, and shared in a real Redis."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, image_input

SCENE = make_keyframe("allow", 1280, 720, seed=21)
SCENE_REENCODED = make_keyframe("allow", 1280, 720, seed=21, quality=70)  # other bytes, same picture
SCENE_WITH_VIOLENCE = make_keyframe("block:violence", 1280, 720, seed=21)  # pHash 2 bits from SCENE


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Gateway settings for each verdict store: this process's memory, or a real Redis."""
    if request.param == "memory":
        return {}
    return {"redis": {"url": request.getfixturevalue("redis_url")}}


def engine_requests(engine: ThreadedServer) -> float:
    """Chat completions the engine has finished."""
    for family in text_string_to_metric_families(httpx.get(f"{engine.url}/metrics", timeout=10).text):
        if family.name == "vllm:request_success":
            return sum(sample.value for sample in family.samples)
    raise AssertionError("no vllm:request_success on the engine")


def moderate(
    gateway: ThreadedServer, frame: bytes, *, key: str | None = None, thinking: str = "off"
) -> dict[str, Any]:
    headers = {"X-Modgate-Thinking": thinking}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    response = httpx.post(
        f"{gateway.url}/v1/moderations",
        json={"model": "m", "input": image_input(frame)},
        headers=headers,
        timeout=60,
    )
    assert response.status_code == 200, response.text
    details: dict[str, Any] = response.json()["results"][0]["modgate"]
    return details


def test_the_same_frame_again_reuses_the_verdict_without_the_engine(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, **store)
    first = moderate(gateway, make_keyframe("block:hate", 640, 360, seed=3))
    calls = engine_requests(sim)
    again = moderate(gateway, make_keyframe("block:hate", 640, 360, seed=3))
    assert first["reused"] is None
    assert again["reused"] == "exact"
    assert again["action"] == first["action"] == "block"
    assert again["prompt_tokens"] == again["completion_tokens"] == 0
    assert again["request_id"] == first["request_id"]  # the engine request that made the verdict
    assert engine_requests(sim) == calls


def test_a_re_encoded_frame_reuses_the_verdict_as_a_near_duplicate(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, **store)
    moderate(gateway, SCENE)
    near = moderate(gateway, SCENE_REENCODED)
    assert near["reused"] == "near"
    assert near["frame_sha256"] != moderate(gateway, SCENE)["frame_sha256"]


def test_the_same_scene_with_a_violation_added_is_judged_afresh(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, **store)
    assert moderate(gateway, SCENE)["action"] == "allow"
    violent = moderate(gateway, SCENE_WITH_VIOLENCE)  # close in pHash, far apart in colour
    assert violent["reused"] is None
    assert violent["action"] == "block"


def test_near_duplicates_can_be_switched_off(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, shaping={"near_duplicate_distance": -1}, **store)
    moderate(gateway, SCENE)
    assert moderate(gateway, SCENE_REENCODED)["reused"] is None
    assert moderate(gateway, SCENE)["reused"] == "exact"


def test_a_verdict_is_not_reused_under_the_other_thinking_mode(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, **store)
    moderate(gateway, SCENE, thinking="off")
    on = moderate(gateway, SCENE, thinking="on")
    assert on["reused"] is None
    assert on["thinking"] == "on"
    assert moderate(gateway, SCENE, thinking="on")["reused"] == "exact"


def test_a_tenant_never_reuses_another_tenants_verdict(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, auth={"api_keys": "k-a:tenant-a,k-b:tenant-b"}, **store)
    moderate(gateway, SCENE, key="k-a")
    assert moderate(gateway, SCENE, key="k-b")["reused"] is None
    assert moderate(gateway, SCENE, key="k-a")["reused"] == "exact"


def test_a_verdict_expires_after_its_ttl(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, shaping={"verdict_cache_ttl_s": 0.5}, **store)
    moderate(gateway, SCENE)
    deadline = time.monotonic() + 10
    while moderate(gateway, SCENE)["reused"] is not None:  # each miss stores it again: one is enough
        assert time.monotonic() < deadline, "the verdict outlived its TTL"
        time.sleep(0.1)


def test_a_zero_ttl_reuses_nothing(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, shaping={"verdict_cache_ttl_s": 0}, **store)
    moderate(gateway, SCENE)
    assert moderate(gateway, SCENE)["reused"] is None


def test_without_the_cache_a_near_duplicate_in_the_same_request_still_reuses_its_leaders_verdict(
    sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    # a lone frame is shaped without its pHash when nothing will look it up; two in one request need theirs
    gateway = start_gateway(engine={"url": sim.url}, shaping={"verdict_cache_ttl_s": 0})
    calls = engine_requests(sim)
    response = httpx.post(
        f"{gateway.url}/v1/moderations",
        json={"model": "m", "input": image_input(SCENE, SCENE_REENCODED)},
        headers={"X-Modgate-Thinking": "off"}, timeout=60,
    )
    assert response.status_code == 200, response.text
    leader, follower = (result["modgate"] for result in response.json()["results"])
    assert (leader["reused"], follower["reused"]) == (None, "near")
    assert engine_requests(sim) == calls + 1
    assert moderate(gateway, SCENE)["reused"] is None


def test_an_unusable_answer_is_not_stored_for_reuse(
    store: dict[str, Any], start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    from deploy.simulator import Faults

    engine = start_sim("instant", faults=Faults(malformed_rate=1.0))
    gateway = start_gateway(engine={"url": engine.url}, **store)
    first = moderate(gateway, SCENE)
    assert first["action"] == "review"
    assert first["reason"]
    assert moderate(gateway, SCENE)["reused"] is None


def test_gateways_sharing_a_redis_reuse_each_others_verdicts(
    redis_url: str, sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    one = start_gateway(engine={"url": sim.url}, redis={"url": redis_url})
    two = start_gateway(engine={"url": sim.url}, redis={"url": redis_url})
    made = moderate(one, SCENE)
    reused = moderate(two, SCENE_REENCODED)
    assert reused["reused"] == "near"
    assert reused["request_id"] == made["request_id"]


def test_redis_keys_carry_the_ttl(redis_url: str, sim: ThreadedServer, start_gateway: GatewayFactory) -> None:
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": redis_url},
                            shaping={"verdict_cache_ttl_s": 120})
    moderate(gateway, SCENE)
    client = redis.Redis.from_url(redis_url)
    keys = [key.decode() for key in client.scan_iter("modgate:verdict*")]
    entries = [key for key in keys if key.startswith("modgate:verdict:")]
    bands = [key for key in keys if key.startswith("modgate:verdict-near:")]
    assert len(entries) == 1
    assert len(bands) == 5
    assert all(0 < client.pttl(key) <= 120_000 for key in keys)
    client.close()


def flip(gateway: ThreadedServer, **fields: Any) -> int:
    """Change the thinking policy; the version it got."""
    response = httpx.put(
        f"{gateway.url}/admin/thinking-policy",
        timeout=10,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        json={**fields, "reason": "verdict reuse test"},
    )
    assert response.status_code == 200, response.text
    version: int = response.json()["version"]
    return version


def test_a_policy_change_the_verdict_does_not_depend_on_keeps_it(
    store: dict[str, Any], sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, **store)
    made = moderate(gateway, SCENE, thinking="off")
    # thinking-on limits and the default mode do not reach a thinking-off engine request
    assert flip(gateway, default_mode="on", max_completion_tokens_on=600, thinking_token_budget=200) == 2
    kept = moderate(gateway, SCENE, thinking="off")
    assert (kept["policy_version"], kept["reused"], kept["request_id"]) == (2, "exact", made["request_id"])
    assert moderate(gateway, SCENE, thinking="on")["reused"] is None  # its limits did change
    assert flip(gateway, max_completion_tokens_off=32) == 3  # a thinking-off limit: judged again
    calls = engine_requests(sim)
    again = moderate(gateway, SCENE, thinking="off")
    assert again["reused"] is None
    assert engine_requests(sim) == calls + 1


def test_a_lost_policy_key_never_hands_out_verdicts_made_under_other_content(
    redis_url: str, sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    """Redis loses the policy while the verdicts survive: numbering restarts at 1, and "version 2" comes
    back with other content. Its verdicts must be judged afresh; the old content's come back with it."""
    first = start_gateway(engine={"url": sim.url}, redis={"url": redis_url})
    assert flip(first, max_completion_tokens_off=24) == 2
    made = moderate(first, SCENE)
    assert (made["policy_version"], made["reused"]) == (2, None)
    first.stop()
    client = redis.Redis.from_url(redis_url)
    lost = list(client.scan_iter("modgate:thinking-policy*"))
    assert lost
    client.delete(*lost)  # an operator's DEL, or a failover to a replica that never had the policy
    assert list(client.scan_iter("modgate:verdict:*"))  # the verdicts survived
    client.close()

    second = start_gateway(engine={"url": sim.url}, redis={"url": redis_url})
    assert moderate(second, SCENE_WITH_VIOLENCE)["policy_version"] == 1  # numbering started again
    assert flip(second, max_completion_tokens_off=48) == 2  # "version 2" again, other limits
    calls = engine_requests(sim)
    judged = moderate(second, SCENE)
    assert (judged["policy_version"], judged["reused"]) == (2, None)
    assert engine_requests(sim) == calls + 1
    assert flip(second, max_completion_tokens_off=24) == 3  # the first content, under a new number
    back = moderate(second, SCENE)
    assert (back["policy_version"], back["reused"], back["request_id"]) == (3, "exact", made["request_id"])
