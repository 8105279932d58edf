"""On loopback: two simulated engines behind one gateway, and two gateway processes sharing one real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import redis

from bench.servers import free_port
from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from deploy.simulator.llamacpp_law import LlamaCppOptions
from gateway.engine.wires import EngineKindSetting
from tests.processes import GatewayProcessesFactory, poll
from tests.support import GatewayFactory, SimFactory, image_input

# The Spark's pace at 1/10: a thinking-on keyframe takes about a second, long enough to overlap in a burst.
SPARK_PACE = {"preset": "spark", "time_scale": 0.1, "max_num_seqs": 64}  # the engine never caps: we must
LEASE_KEY = "modgate:engine-leases:{url}"


def frame_body(seed: int) -> dict[str, Any]:
    """One small keyframe, different per seed."""
    return {"input": image_input(make_keyframe("allow", 320, 180, seed=seed))}


def sim_info(sim_url: str) -> dict[str, Any]:
    info: dict[str, Any] = httpx.get(f"{sim_url}/sim/info", timeout=10).json()
    return info


def metric(gateway_url: str, line_start: str) -> float | None:
    """The value of the first /metrics line that starts with ``line_start``."""
    for line in httpx.get(f"{gateway_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def replica_env(engine_url: str, redis_url: str) -> dict[str, str]:
    """A gateway process's settings for one engine, with its cap (8) shared through Redis leases."""
    return {
        "MODGATE_ENGINE__URL": engine_url,
        "MODGATE_REDIS__URL": redis_url,
        "MODGATE_ENGINE__MAX_INFLIGHT": "8",
        "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0",
        "MODGATE_TELEMETRY__ENGINE_SCRAPE_INTERVAL_S": "0",
        # A lease call slower than its deadline counts as Redis down and the replica serves on its local
        # cap (by design: tests/multi_engine/test_engine_leases.py); on a 2-core machine at load 10 a
        # gateway can stall past the default 0.5 s, which is starvation, not what these tests are about.
        "MODGATE_LEASES__REDIS_TIMEOUT_S": "5",
    }


@contextmanager
def burst(targets: list[str], count: int, workers: int = 48) -> Iterator[list[Future[int]]]:
    """``count`` moderation calls at once, spread over ``targets`` in turn; yields their status futures."""
    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=workers))

    def call(index: int) -> int:
        try:
            target = targets[index % len(targets)]
            return client.post(f"{target}/v1/moderations", json=frame_body(index)).status_code
        except httpx.HTTPError:
            return 0  # the gateway went away mid-call (killed on purpose)

    with client, ThreadPoolExecutor(max_workers=workers) as pool:
        yield [pool.submit(call, index) for index in range(count)]


def test_two_engines_each_get_no_more_than_their_own_cap_and_both_are_used(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    small, large = start_sim(**SPARK_PACE), start_sim(**SPARK_PACE)
    gateway = start_gateway(
        engine={"url": f"{small.url},{large.url}", "caps": f"{small.url}=2,{large.url}=3"},
        shaping={"verdict_cache_ttl_s": 0},
    )
    with burst([gateway.url], 20) as calls:
        statuses = [call.result() for call in calls]
    assert statuses == [200] * 20
    assert sim_info(small.url)["peak_running"] == 2
    assert sim_info(large.url)["peak_running"] == 3
    ready = httpx.get(f"{gateway.url}/readyz", timeout=10).json()
    engines = [(e["url"], e["up"], e["cap"]) for e in ready["engines"]]
    assert engines == [(small.url, True, 2), (large.url, True, 3)]
    assert metric(gateway.url, f'modgate_engine_slot_cap{{engine="{large.url}"}}') == 3
    assert metric(gateway.url, f'modgate_engine_slot_inflight{{engine="{small.url}"}}') == 0


def test_a_stopped_engine_is_marked_down_its_calls_go_to_the_other_and_it_is_used_again_when_back(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    flaky, steady = start_sim(), start_sim()
    # One failure opens the circuit here: calls one at a time always find the other engine idle, and the
    # tie-break steers them away from the engine that failed, so a second failure would never come.
    gateway = start_gateway(
        engine={"url": f"{flaky.url},{steady.url}"},
        shaping={"verdict_cache_ttl_s": 0},
        # the engine reads down from the failure until a probe succeeds, whatever the cool-down
        circuit={"consecutive_failures": 1, "cooldown_s": 3.0},
    )

    def flaky_circuit() -> str:
        engines = httpx.get(f"{gateway.url}/readyz", timeout=10).json()["engines"]
        return str(engines[0]["circuit"])

    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        assert client.post("/v1/moderations", json=frame_body(0)).status_code == 200
        flaky.stop()
        statuses = [client.post("/v1/moderations", json=frame_body(seed)).status_code for seed in range(1, 7)]
        assert statuses == [200] * 6  # every call the stopped engine could not take went to the other
        # The failure that opened its circuit is behind us, and no probe can succeed while it is stopped:
        # down now, however long the six calls took (the cool-down may well have passed meanwhile).
        assert metric(gateway.url, f'modgate_engine_up{{engine="{flaky.url}"}}') == 0
        ready = client.get("/readyz")
        assert ready.status_code == 200  # one engine up is enough
        assert [e["up"] for e in ready.json()["engines"]] == [False, True]
        assert flaky_circuit() != "closed"
        back = ThreadedServer(create_sim_app(PRESETS["instant"], 0.0), port=flaky.port).start()
        seeds = iter(range(100, 10_000))
        try:

            def back_in_use() -> bool:
                assert client.post("/v1/moderations", json=frame_body(next(seeds))).status_code == 200
                return bool(sim_info(back.url)["peak_running"] >= 1)

            poll(back_in_use, 30, "the engine to be probed and used again once it is back")
            assert flaky_circuit() == "closed"
        finally:
            back.stop()


def test_a_gateway_whose_first_engine_is_dead_at_start_is_ready_and_serves_on_the_second(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    alive = start_sim()
    gateway = start_gateway(engine={"url": f"{dead},{alive.url}"})
    ready = httpx.get(f"{gateway.url}/readyz", timeout=30)
    assert ready.status_code == 200
    assert [engine["up"] for engine in ready.json()["engines"]] == [False, True]
    answered = httpx.post(f"{gateway.url}/v1/moderations", json=frame_body(1), timeout=30)
    assert answered.status_code == 200


def test_two_gateway_replicas_sharing_redis_keep_one_engine_cap_across_both(
    start_sim: SimFactory, gateway_processes: GatewayProcessesFactory, redis_url: str
) -> None:
    engine = start_sim(**SPARK_PACE)
    replicas = gateway_processes(2, **replica_env(engine.url, redis_url))
    with burst([replica.url for replica in replicas], 40) as calls:
        statuses = [call.result() for call in calls]
    assert statuses == [200] * 40
    assert sim_info(engine.url)["peak_running"] == 8  # each replica alone would have sent 8


def test_a_killed_replicas_slots_free_themselves_and_the_other_replica_uses_all_of_them(
    start_sim: SimFactory, gateway_processes: GatewayProcessesFactory, redis_url: str
) -> None:
    engine = start_sim(**SPARK_PACE)
    survivor, doomed = gateway_processes(
        2,
        **replica_env(engine.url, redis_url),
        MODGATE_LEASES__TTL_S="3",
        MODGATE_LEASES__RENEW_EVERY_S="1",
    )
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    key = LEASE_KEY.format(url=engine.url)
    try:
        with burst([doomed.url], 12):
            doomed_leases = set(
                poll(
                    lambda: len(members := store.zrange(key, 0, -1)) == 8 and members,
                    30,
                    "the doomed replica to hold all 8 slots",
                )
            )
            doomed.kill()
        assert store.zcard(key) == 8  # nobody gave them back: only their expiry can free them

        def survivor_holds_all_eight() -> bool:
            members = set(store.zrange(key, 0, -1))
            return len(members) == 8 and not members & doomed_leases

        with burst([survivor.url], 40) as calls:
            poll(
                survivor_holds_all_eight,
                30,
                "the killed replica's leases to expire and the survivor to take all 8",
                every_s=0.02,
            )
            statuses = [call.result() for call in calls]
        assert statuses == [200] * 40
        assert sim_info(engine.url)["peak_running"] <= 8
    finally:
        store.close()


def test_a_pool_of_both_kinds_caps_each_by_its_own_terms_and_fails_over_across_kinds(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    """vLLM's cap is the gateway's (MODGATE_ENGINE__MAX_INFLIGHT), llama.cpp's its --parallel slots; each kind
    gets its own wire, and a call the stopped one cannot take goes to the other kind."""
    vllm = start_sim(**SPARK_PACE)
    llamacpp = start_sim(**SPARK_PACE, kind="llamacpp", llamacpp=LlamaCppOptions(n_parallel=2, n_ctx=8192))
    gateway = start_gateway(
        engine={"url": f"{vllm.url},{llamacpp.url}", "max_inflight": 3}, shaping={"verdict_cache_ttl_s": 0}
    )
    with burst([gateway.url], 16) as calls:
        statuses = [call.result() for call in calls]
    assert statuses == [200] * 16
    ready = httpx.get(f"{gateway.url}/readyz", timeout=10).json()
    engines = [(e["url"], e["kind"], e["cap"]) for e in ready["engines"]]
    assert engines == [(vllm.url, "vllm", 3), (llamacpp.url, "llamacpp", 2)]
    assert sim_info(vllm.url)["peak_running"] == 3
    assert sim_info(llamacpp.url)["peak_running"] == 2  # both kinds used, neither above its cap
    vllm.stop()
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        statuses = [client.post("/v1/moderations", json=frame_body(100 + s)).status_code for s in range(4)]
    assert statuses == [200] * 4  # llama.cpp took every call the stopped vLLM could not


def llamacpp_options(slots: int) -> LlamaCppOptions:
    """``--parallel slots`` with 4,096 tokens of context each."""
    return LlamaCppOptions(n_parallel=slots, n_ctx=4096 * slots)


@pytest.mark.parametrize("kind", ["auto", "llamacpp"])
def test_two_replicas_sharing_redis_hold_a_llamacpp_engine_to_its_slots_detected_or_told(
    kind: EngineKindSetting, start_sim: SimFactory, gateway_processes: GatewayProcessesFactory, redis_url: str
) -> None:
    """The leases' cap is llama-server's --parallel slots from /props, also when MODGATE_ENGINE__KIND says
    llamacpp (nothing to detect, but the slots are still read), however many MODGATE_ENGINE__MAX_INFLIGHT
    allows."""
    engine = start_sim(**SPARK_PACE, kind="llamacpp", llamacpp=llamacpp_options(3))
    replicas = gateway_processes(
        2,
        **replica_env(engine.url, redis_url),
        MODGATE_ENGINE__KIND=kind,
    )
    with burst([replica.url for replica in replicas], 30) as calls:
        statuses = [call.result() for call in calls]
    assert statuses == [200] * 30
    # at most its slots at llama-server at once, running or waiting inside it, and all of them used
    assert sim_info(engine.url)["peak_requests"] == 3
    for replica in replicas:
        ready = httpx.get(f"{replica.url}/readyz", timeout=10).json()
        assert [(e["kind"], e["cap"]) for e in ready["engines"]] == [("llamacpp", 3)]


@pytest.mark.parametrize("replica_count", [1, 2])
def test_a_llamacpp_engine_restarted_with_fewer_slots_gets_no_more_even_from_a_burst_at_once(
    replica_count: int, start_gateway: GatewayFactory, redis_url: str
) -> None:
    """llama-server restarted behind the same URL with a smaller --parallel, and a burst sent through every
    replica as soon as it answers /health, before any replica has had a call fail or read /props again: the
    slots are read before a slot of the cap is taken, so the burst never puts more in flight than it has."""
    def llamacpp(slots: int, port: int = 0) -> ThreadedServer:
        app = create_sim_app(
            PRESETS["spark"].scaled(max_num_seqs=64), 0.1, kind="llamacpp", llamacpp=llamacpp_options(slots)
        )
        return ThreadedServer(app, port=port).start()

    engine = llamacpp(8)
    replicas = [
        # a loaded machine's slow lease call (0.5 s by default) would leave each replica on its local cap,
        # which is a Redis outage's rule, not the one this test holds
        start_gateway(engine={"url": engine.url, "max_inflight": 16}, redis={"url": redis_url},
                      shaping={"verdict_cache_ttl_s": 0}, leases={"redis_timeout_s": 5.0})
        for _ in range(replica_count)
    ]
    targets = [replica.url for replica in replicas]
    try:
        with burst(targets, 24) as calls:
            assert [call.result() for call in calls] == [200] * 24
        assert sim_info(engine.url)["peak_requests"] == 8  # its slots, not the gateway's cap of 16
        engine.stop()
        engine = llamacpp(4, port=engine.port)
        poll(lambda: httpx.get(f"{engine.url}/health", timeout=5).status_code == 200, 30, "its /health")
        with burst(targets, 24) as calls:
            assert [call.result() for call in calls] == [200] * 24
        assert sim_info(engine.url)["peak_requests"] == 4  # none waiting inside llama-server, all slots used
    finally:
        engine.stop()
