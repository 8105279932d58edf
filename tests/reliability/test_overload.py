"""200 clients at once against a cap of 8: each gets a verdict or a 429 with Retry-After, the engine never
sees more than 8, and the gateway's memory stays bounded."""

from __future__ import annotations

import asyncio

import httpx

from deploy.keyframes import make_keyframe
from tests.processes import GatewayProcessFactory
from tests.reliability.conftest import error_body
from tests.support import SimFactory, image_input

CLIENTS = 200
PEAK_RSS_BOUND = 1024 * 1024 * 1024  # generous: the gateway idles near a tenth of it


async def test_two_hundred_clients_get_a_verdict_or_a_429_and_the_engine_never_sees_more_than_eight(
    start_sim: SimFactory, gateway_process: GatewayProcessFactory
) -> None:
    # The engine would run 64 at once: only the gateway's cap can hold it to 8.
    sim = start_sim("spark", time_scale=0.01, max_num_seqs=64)
    gateway = gateway_process(
        MODGATE_ENGINE__URL=sim.url,
        MODGATE_ENGINE__MAX_INFLIGHT="8",
        MODGATE_ADMISSION__QUEUE_SIZE="64",
        MODGATE_ADMISSION__QUEUE_TIMEOUT_S="30",
    )
    frames = [make_keyframe("allow", 320, 180, seed=i) for i in range(CLIENTS)]
    limits = httpx.Limits(max_connections=CLIENTS + 10, max_keepalive_connections=CLIENTS + 10)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120, limits=limits) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/moderations", json={"input": image_input(frame)}) for frame in frames)
        )
        info = (await client.get(f"{sim.url}/sim/info")).json()
        still_up = await client.get("/healthz")
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= 8 + 64  # at least the slots and the queue were served
    assert statuses.count(429) > 0  # and the overload was real
    for answer in answers:
        if answer.status_code == 200:
            assert answer.json()["results"][0]["modgate"]["action"] == "allow"
        else:
            assert int(answer.headers["Retry-After"]) >= 1
            assert error_body(answer)["type"] == "rate_limit_error"
    assert info["peak_running"] == 8
    assert still_up.status_code == 200
    assert gateway.peak_rss_bytes() < PEAK_RSS_BOUND, gateway.peak_rss_bytes()
