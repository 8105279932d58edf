"""Per-tenant quotas: keyframes per minute (shared by replicas through Redis) and requests at once; over a
quota the official ``openai`` client gets a 429 with ``Retry-After`` and the ``x-ratelimit-*`` headers."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as redis_asyncio
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app as cli
from deploy.keyframes import make_keyframe
from gateway.http.quotas import MemoryKeyframeRate, RedisKeyframeRate, reset_header
from tests.support import GatewayFactory, SimFactory, image_input

KEYS = "key-a:tenant-a,key-b:tenant-b"
FRAME = make_keyframe("allow", 192, 108, seed=7)


def client(gateway: ThreadedServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)


def moderate_raw(gateway: ThreadedServer, key: str, frames: int = 1) -> Any:
    """One moderation with the official client; answers its raw response (headers and parsed body)."""
    with client(gateway, key) as openai_client:
        return openai_client.moderations.with_raw_response.create(
            model="modgate-moderation", input=image_input(*[FRAME] * frames)  # type: ignore[arg-type]  # image parts
        )


def refused(gateway: ThreadedServer, key: str, frames: int = 1) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as error:
        moderate_raw(gateway, key, frames)
    return error.value


def test_over_the_keyframe_quota_the_openai_client_gets_a_429_with_the_rate_headers(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(
        engine_url=sim.url, api_keys=KEYS, tenants={"keyframes_per_minute": {"tenant-a": 3}}
    )
    first = moderate_raw(gateway, "key-a", frames=2)
    assert first.headers["x-ratelimit-limit-requests"] == "3"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert len(first.parse().results) == 2
    moderate_raw(gateway, "key-a")
    error = refused(gateway, "key-a")
    assert error.status_code == 429
    body = error.response.json()["error"]  # the OpenAI error shape
    assert body["message"].startswith("tenant quota of 3 keyframes a minute used up")
    assert {k: body[k] for k in ("type", "param", "code")} == {
        "type": "rate_limit_error", "param": None, "code": "keyframes_per_minute_exceeded"
    }
    headers = error.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    reset = re.fullmatch(r"(?:(\d+)m)?(\d+)s", headers["x-ratelimit-reset-requests"])
    assert reset is not None, headers["x-ratelimit-reset-requests"]
    assert 50 <= 60 * int(reset[1] or 0) + int(reset[2]) <= 60  # the three keyframes' minute, nearly whole
    # another tenant has its own quota (none here): unaffected, and no rate headers
    other = moderate_raw(gateway, "key-b")
    assert "x-ratelimit-limit-requests" not in other.headers


def test_a_request_larger_than_the_whole_quota_is_a_400_not_a_429(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS, tenants={"default_keyframes_per_minute": 2})
    with pytest.raises(openai.BadRequestError) as error, client(gateway, "key-b") as openai_client:
        openai_client.moderations.create(model="m", input=image_input(*[FRAME] * 3))  # type: ignore[arg-type]  # image parts
    body = error.value.body
    assert isinstance(body, dict)
    assert body["code"] == "request_over_quota"


def test_the_keyframe_quota_holds_across_replicas_through_redis(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str
) -> None:
    # One keyframe a minute, the slowest refill a quota has: the shared quota is earned back only a full
    # minute after the first keyframe, so the refusals below do not hang on how fast this machine answers
    # (at 3 a minute a keyframe came back every 20 s, and a loaded machine's four requests took longer).
    settings: dict[str, Any] = {"engine_url": sim.url, "api_keys": KEYS, "redis_url": redis_url,
                                "tenants": {"keyframes_per_minute": {"tenant-a": 1}}}
    one, two = start_gateway(**settings), start_gateway(**settings)
    assert moderate_raw(one, "key-a").headers["x-ratelimit-remaining-requests"] == "0"
    over = refused(two, "key-a").response  # the keyframe taken through the first replica counts here too
    refused_one = refused(one, "key-a").response
    assert over.status_code == 429
    assert over.headers["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(over.headers["retry-after"]) <= 60
    assert refused_one.headers["x-ratelimit-remaining-requests"] == "0"
    assert moderate_raw(two, "key-b").status_code == 200  # another tenant's quota is its own


def test_limits_set_in_redis_with_the_cli_reach_a_running_gateway(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS, redis_url=redis_url,
                            tenants={"reload_interval_s": 0.1, "weights": {"tenant-b": 1.0}})
    moderate_raw(gateway, "key-b")
    moderate_raw(gateway, "key-b")  # no quota yet
    result = CliRunner().invoke(
        cli, ["tenants", "set", "tenant-b", "--keyframes-per-minute", "1", "--weight", "4"],
        env={"MODGATE_REDIS__URL": redis_url},
    )
    assert result.exit_code == 0, result.output
    listed = CliRunner().invoke(cli, ["tenants", "list"], env={"MODGATE_REDIS__URL": redis_url})
    assert '"keyframes_per_minute": 1' in listed.stdout
    assert '"weight": 4.0' in listed.stdout

    def row() -> dict[str, Any]:
        rows = httpx.get(f"{gateway.url}/stats", timeout=10).json()["tenants"]
        return next(r for r in rows if r["tenant"] == "tenant-b")

    deadline = time.monotonic() + 10
    while row()["quota"]["keyframes_per_minute"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert row()["weight"] == 4.0  # the Redis value overrides the settings'
    moderate_raw(gateway, "key-b")
    assert refused(gateway, "key-b").response.headers["x-ratelimit-limit-requests"] == "1"
    cleared = CliRunner().invoke(cli, ["tenants", "clear", "tenant-b"], env={"MODGATE_REDIS__URL": redis_url})
    assert cleared.stdout.startswith("cleared")


def test_bad_limits_are_refused_by_the_cli(redis_url: str) -> None:
    result = CliRunner().invoke(cli, ["tenants", "set", "tenant-b", "--weight", "-1"],
                                env={"MODGATE_REDIS__URL": redis_url})
    assert result.exit_code == 2


async def test_over_the_concurrent_requests_quota_a_429_says_so(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim("spark", time_scale=0.02)  # ~0.2 s a call: the requests overlap
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS, tenants={"max_concurrent": {"tenant-a": 1}})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60,
                                 headers={"Authorization": "Bearer key-a"}) as http:
        responses = await asyncio.gather(*(
            http.post("/v1/moderations", json={"input": image_input(frame)})
            for frame in (make_keyframe("allow", 192, 108, seed=i) for i in range(4))
        ))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 1, statuses
    assert statuses.count(429) >= 1, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["code"] == "concurrent_requests_exceeded"
            assert int(response.headers["Retry-After"]) >= 1


async def test_the_memory_rate_earns_the_quota_back_evenly() -> None:
    now = [1000.0]
    rate = MemoryKeyframeRate(clock=lambda: now[0])
    assert (await rate.take("t", 60, 60)).allowed  # the whole minute at once
    blocked = await rate.take("t", 60, 1)
    assert not blocked.allowed
    assert blocked.retry_after_s(1) == 1
    now[0] += 1.0  # one keyframe a second comes back
    assert (await rate.take("t", 60, 1)).allowed
    assert not (await rate.take("t", 60, 1)).allowed
    assert reset_header(59.2) == "1m0s"
    assert reset_header(0.25) == "250ms"
    assert reset_header(6) == "6s"


async def test_with_redis_unreachable_the_keyframe_quota_is_counted_per_replica() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = redis_asyncio.Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.2)
    rate = RedisKeyframeRate(client)
    try:
        assert (await rate.take("t", 2, 2)).allowed
        assert rate.local_only  # said once in the log; counted in this process meanwhile
        assert not (await rate.take("t", 2, 1)).allowed
    finally:
        await client.aclose()
