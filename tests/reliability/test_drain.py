"""SIGTERM drains, then stops: ``/readyz`` answers 503 at once while the listener stays open for
``MODGATE_SERVER__DRAIN_S``; requests in flight and queued finish; running jobs go back to the stream for
another gateway (none lost, none completed twice); the process exits 0 (one worker or several)."""

from __future__ import annotations

import signal
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from deploy.keyframes import make_keyframe
from gateway.jobs.models import as_text
from gateway.jobs.store_redis import GROUP, STREAM, RedisJobStore
from tests.processes import GatewayProcess, GatewayProcessFactory, poll
from tests.support import SimFactory, image_input


def _moderate(url: str, seed: int) -> int:
    body = {"input": image_input(make_keyframe("allow", 320, 180, seed=seed))}
    with httpx.Client(base_url=url, timeout=60) as client:
        return client.post("/v1/moderations", json=body).status_code


def _status(url: str, path: str) -> int | None:
    """The status of a GET on a new connection; None when nothing listens (connection refused)."""
    try:
        return httpx.get(f"{url}{path}", timeout=5).status_code
    except httpx.TransportError:
        return None


def _inflight(url: str) -> int:
    document: dict[str, Any] = httpx.get(f"{url}/stats", timeout=5).json()
    return int(document["inflight"]) + int(document["queued"])


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_drains_serves_on_and_exits_zero(
    workers: int, start_sim: SimFactory, gateway_process: GatewayProcessFactory, redis_url: str
) -> None:
    # The Spark's pace sped up: a keyframe holds its slot about a second, so the signal lands mid-work.
    sim = start_sim("spark", time_scale=0.2)
    gateway = gateway_process(
        MODGATE_ENGINE__URL=sim.url, MODGATE_REDIS__URL=redis_url, MODGATE_ENGINE__MAX_INFLIGHT="2",
        MODGATE_SERVER__DRAIN_S="4", MODGATE_WORKERS=str(workers),
    )
    gateway.wait_ready("/readyz")
    with ThreadPoolExecutor(8) as pool:
        before = [pool.submit(_moderate, gateway.url, seed) for seed in range(6)]  # 2 in flight, 4 queued
        poll(lambda: _inflight(gateway.url) > 0, 30, "requests in flight at the gateway")
        gateway.process.send_signal(signal.SIGTERM)
        poll(lambda: _status(gateway.url, "/readyz") == 503, 10, "/readyz to answer 503 after SIGTERM")
        # Draining: readiness withdrawn, yet a new caller on a new connection is still served.
        during: Future[int] = pool.submit(_moderate, gateway.url, 99)
        assert during.result() == 200
        assert [request.result() for request in before] == [200] * 6
    assert gateway.process.wait(60) == 0  # exit 0, not killed by the signal
    assert _status(gateway.url, "/healthz") is None  # and then it is gone


def test_a_draining_gateway_gives_its_running_jobs_back(
    start_sim: SimFactory, gateway_process: GatewayProcessFactory, redis_url: str
) -> None:
    sim = start_sim("spark", time_scale=0.3)
    env = {
        "MODGATE_ENGINE__URL": sim.url,
        "MODGATE_REDIS__URL": redis_url,
        # A takeover by idle time would take ten minutes: only a requeue at stop lets the second finish.
        "MODGATE_JOBS__CLAIM_IDLE_S": "600",
        "MODGATE_JOBS__CONCURRENCY": "2",
        "MODGATE_JOBS__STOP_GRACE_S": "0",  # cut running jobs off at once (the worst case)
        "MODGATE_SERVER__DRAIN_S": "0.5",
    }
    state = redis.Redis.from_url(redis_url)
    first = gateway_process(**env)
    ids = _submit_jobs(first, 4)

    def statuses() -> list[str]:
        found = [state.hget(RedisJobStore.job_key(job_id), "status") for job_id in ids]
        return [as_text(status or b"gone") for status in found]

    poll(lambda: "running" in statuses(), 30, "a job to be running")
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(60) == 0
    assert "running" in statuses() or "queued" in statuses()  # work was left for another gateway

    second = gateway_process(**env)
    poll(lambda: statuses() == ["succeeded"] * len(ids), 120, "every job to succeed", every_s=0.2)
    poll(lambda: state.xlen(STREAM) == 0 and state.xpending(STREAM, GROUP)["pending"] == 0, 30,
         "every stream entry to be acknowledged")
    records = [state.hgetall(RedisJobStore.job_key(job_id)) for job_id in ids]
    assert [r[b"completions"] for r in records] == [b"1"] * len(ids)  # none completed twice
    assert max(int(r[b"attempts"]) for r in records) >= 2  # a job cut off by the stop was worked again
    assert "back on the stream for another gateway" in first.log()
    second.stop()
    state.close()


def _submit_jobs(gateway: GatewayProcess, count: int) -> list[str]:
    ids = []
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        for n in range(count):
            frames = image_input(*(make_keyframe("allow", 320, 180, seed=10 * n + i) for i in range(4)))
            answer = client.post("/v1/jobs", json={"video_id": f"video-{n}", "frames": frames})
            assert answer.status_code == 202
            ids.append(answer.json()["id"])
    return ids


def test_the_kubernetes_deployment_drains_within_its_grace_period() -> None:
    from pathlib import Path

    import yaml

    base = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
    config = yaml.safe_load((base / "gateway-config.yaml").read_text())["data"]
    pod = yaml.safe_load((base / "gateway-deployment.yaml").read_text())["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "preStop" in container["lifecycle"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    needed = (
        float(config["MODGATE_SERVER__DRAIN_S"])
        + float(config.get("MODGATE_ADMISSION__QUEUE_TIMEOUT_S", 30))
        + float(config["MODGATE_JOBS__STOP_GRACE_S"])
    )
    assert pod["terminationGracePeriodSeconds"] > needed
