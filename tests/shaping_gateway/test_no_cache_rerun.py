"""``Cache-Control: no-cache`` asks for a fresh engine verdict instead of a reused one."""

from __future__ import annotations

import httpx

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import image_input


def test_a_repeat_is_reused_unless_the_caller_says_no_cache(gateway: ThreadedServer) -> None:
    body = {"input": image_input(make_keyframe("allow", 320, 180, seed=77))}
    first = httpx.post(f"{gateway.url}/v1/moderations", json=body).json()["results"][0]["modgate"]
    again = httpx.post(f"{gateway.url}/v1/moderations", json=body).json()["results"][0]["modgate"]
    fresh = httpx.post(
        f"{gateway.url}/v1/moderations", json=body, headers={"Cache-Control": "no-cache"}
    ).json()["results"][0]["modgate"]
    assert first["reused"] is None
    assert again["reused"] == "exact"
    assert fresh["reused"] is None
    assert fresh["request_id"] != first["request_id"]
