"""``/readyz``'s ``primed`` says a priming was answered, and nothing else."""

from __future__ import annotations

import asyncio
import time

import httpx

from gateway.engine.client import EngineClient
from gateway.engine.prefix_keeper import PrefixKeeper
from gateway.series.metrics import GatewayMetrics

ENGINE = "http://engine:8000"


def test_an_engine_read_again_after_it_came_back_is_not_said_primed_when_no_priming_answered() -> None:
    up = False

    def engine(request: httpx.Request) -> httpx.Response:
        if not up:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/props":  # back as llama-server: the strategy is none, nothing is primed
            return httpx.Response(200, json={"total_slots": 4})
        return httpx.Response(404)

    async def scenario() -> dict[str, object]:
        nonlocal up
        client = EngineClient(ENGINE, connect_timeout_s=1.0, first_token_timeout_s=1.0, total_timeout_s=1.0,
                              connect_retries=0, max_connections=1, transport=httpx.MockTransport(engine))
        keeper = PrefixKeeper("auto", [client], GatewayMetrics(), fill_max_tokens=4096,
                              reprime_interval_s=0.0)
        await keeper.start({})
        state = keeper.engines[ENGINE]
        assert state.unread
        up = True
        keeper.observe(ENGINE, "json", 500, 0, time.monotonic())  # its first answer: read it again
        assert state.task is not None
        await state.task
        await client.aclose()
        return state.document()

    document = asyncio.run(scenario())
    assert (document["strategy"], document["primings"]) == ("none", 0)
    assert document["primed"] is False
