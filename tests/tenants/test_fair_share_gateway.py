"""Through the gateway: an engine that records the order of the calls it is sent sees each tenant's share
of the one slot follow the weights, counted in engine work (thinking on costs more than thinking off)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.http.app import create_app
from gateway.settings import Settings, TenantSettings
from tests.support import ADMIN_TOKEN, SimFactory, forward, image_input


class RecordingEngine:
    """Forwards to a simulator, records each chat call's request id in arrival order; holds the first call
    until :meth:`release`, so the tenants' requests can all queue behind it."""

    def __init__(self, sim_url: str) -> None:
        self.sim_url = sim_url
        self.calls: list[str] = []
        self.released = threading.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            self.calls.append(request.headers["x-request-id"])
            if len(self.calls) == 1:
                await asyncio.to_thread(self.released.wait, 30)
        return await forward(request, self.sim_url)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def recorded(start_sim: SimFactory) -> Iterator[tuple[RecordingEngine, list[ThreadedServer]]]:
    engine = RecordingEngine(start_sim().url)
    servers: list[ThreadedServer] = []
    yield engine, servers
    engine.release()
    for server in servers:
        server.stop()


def gateway_for(recorded: tuple[RecordingEngine, list[ThreadedServer]], **settings: Any) -> ThreadedServer:
    engine, servers = recorded
    fields: dict[str, Any] = {
        "admin_token": ADMIN_TOKEN, "max_inflight": 1, "shaping": {"verdict_cache_ttl_s": 0}, **settings
    }
    server = ThreadedServer(create_app(Settings(**fields), httpx.MockTransport(engine.handle))).start()
    servers.append(server)
    return server


async def engine_calls(gateway: ThreadedServer, engine: RecordingEngine, requests: list[tuple[str, str]],
                       later: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, dict[str, Any]]]:
    """Plug the slot, queue ``(tenant, thinking)`` requests (tenant = its API key), then ``later`` ones, free
    it: each call's tenant and result details, in the order the engine started them."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:

        def post(key: str, thinking: str, seed: int) -> asyncio.Task[httpx.Response]:
            body = {"input": image_input(make_keyframe("allow", 192, 108, seed=seed))}
            headers = {"Authorization": f"Bearer {key}", "X-Modgate-Thinking": thinking}
            return asyncio.create_task(http.post("/v1/moderations", json=body, headers=headers))

        plug = post("plug", "on", 0)
        while not engine.calls:  # noqa: ASYNC110 - the engine runs in the gateway's thread: poll it
            await asyncio.sleep(0.01)
        tasks = [post(key, thinking, seed) for seed, (key, thinking) in enumerate(requests, start=1)]
        while (await http.get("/stats")).json()["queued"] < len(requests):  # noqa: ASYNC110 - over HTTP
            await asyncio.sleep(0.01)
        tasks += [post(key, mode, seed) for seed, (key, mode) in enumerate(later, start=len(tasks) + 1)]
        requests = [*requests, *later]
        while (await http.get("/stats")).json()["queued"] < len(requests):  # noqa: ASYNC110 - over HTTP
            await asyncio.sleep(0.01)
        engine.release()
        responses = [await plug, *await asyncio.gather(*tasks)]
    assert [r.status_code for r in responses] == [200] * len(responses)
    made = {
        f"{r.json()['id']}-0": (key, r.json()["results"][0]["modgate"])
        for r, (key, _) in zip(responses[1:], requests, strict=True)
    }
    return [made[call] for call in engine.calls[1:]]


async def engine_order(gateway: ThreadedServer, engine: RecordingEngine,
                       requests: list[tuple[str, str]]) -> list[str]:
    """The tenants in the order the engine started their calls."""
    return [tenant for tenant, _ in await engine_calls(gateway, engine, requests)]


KEYS = "plug:plug,a:a,b:b,c:c"


@pytest.mark.parametrize(
    ("weights", "first", "expected"),
    [
        ({"a": 2.0, "b": 1.0}, 15, {"a": 10, "b": 5}),
        ({"a": 3.0, "b": 2.0, "c": 1.0}, 18, {"a": 9, "b": 6, "c": 3}),
    ],
    ids=["two-tenants-2-1", "three-tenants-3-2-1"],
)
async def test_tenants_share_the_engine_by_their_weights(
    recorded: tuple[RecordingEngine, list[ThreadedServer]], weights: dict[str, float], first: int,
    expected: dict[str, int],
) -> None:
    gateway = gateway_for(recorded, api_keys=KEYS, tenants={"weights": weights})
    order = await engine_order(gateway, recorded[0], [(t, "off") for _ in range(12) for t in weights])
    share = Counter(order[:first])
    for tenant, count in expected.items():
        assert abs(share[tenant] - count) <= 1, (share, order)


async def test_the_share_is_engine_work_so_a_thinking_tenant_gets_fewer_turns(start_sim: SimFactory) -> None:
    engine = RecordingEngine(start_sim("spark", time_scale=0.0).url)  # the Spark's output lengths
    weight = TenantSettings().output_token_weight  # the gateway's own measure: prompt + w × output tokens
    servers: list[ThreadedServer] = []
    try:
        # the Spark's weight, set: a simulator answering at time scale 0 has no times to learn it from
        gateway = gateway_for((engine, servers), api_keys=KEYS, tenants={"output_token_weight": weight})
        requests = [(t, m) for _ in range(16) for t, m in (("a", "on"), ("b", "off"))]
        calls = (await engine_calls(gateway, engine, requests))[:16]
    finally:
        engine.release()
        for server in servers:
            server.stop()

    def work(details: dict[str, Any]) -> float:
        return float(details["prompt_tokens"] + weight * details["completion_tokens"])

    turns = Counter(tenant for tenant, _ in calls)
    served = {t: sum(work(d) for tenant, d in calls if tenant == t) for t in ("a", "b")}
    dearest = max(work(d) for _, d in calls)
    assert turns["b"] >= turns["a"] + 4, turns  # counted in turns it would be 8 and 8
    assert abs(served["a"] - served["b"]) <= dearest, (served, turns)  # within one call of equal work


async def test_fifo_serves_tenants_in_arrival_order(
    recorded: tuple[RecordingEngine, list[ThreadedServer]],
) -> None:
    gateway = gateway_for(recorded, api_keys=KEYS, admission={"fairness": "fifo"})
    calls = await engine_calls(gateway, recorded[0], [("a", "off")] * 10, later=(("b", "off"),))
    assert [tenant for tenant, _ in calls] == ["a"] * 10 + ["b"]  # b waited for a's whole backlog
