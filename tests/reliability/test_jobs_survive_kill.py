"""A gateway killed with ``kill -9`` in the middle of its jobs loses none: a new gateway on the same Redis
takes the pending work over, and every idempotency key is completed exactly once."""

from __future__ import annotations

from typing import Any

import httpx
import redis

from deploy.keyframes import make_keyframe
from gateway.jobs.store_redis import GROUP, STREAM, RedisJobStore
from gateway.jobs.webhooks import verify_webhook
from tests.processes import GatewayProcessFactory, poll
from tests.reliability.conftest import WEBHOOK_SECRET, WebhookReceiver
from tests.support import SimFactory, image_input

JOBS = 6
FRAMES = 4  # per job


def test_jobs_survive_a_gateway_killed_mid_work(
    start_sim: SimFactory,
    gateway_process: GatewayProcessFactory,
    redis_url: str,
    webhook_receiver: WebhookReceiver,
) -> None:
    # The Spark's pace, sped up: a job's four frames take a few seconds, so the kill lands mid-work.
    sim = start_sim("spark", time_scale=0.3)
    env = {
        "MODGATE_ENGINE__URL": sim.url,
        "MODGATE_REDIS__URL": redis_url,
        "MODGATE_JOBS__CLAIM_IDLE_S": "2",
        "MODGATE_JOBS__CONCURRENCY": "2",
        "MODGATE_JOBS__WEBHOOK_SECRET": WEBHOOK_SECRET,
        "MODGATE_JOBS__WEBHOOK_ALLOWLIST": "127.0.0.1",
    }

    def frames(n: int) -> list[dict[str, Any]]:
        return image_input(*(make_keyframe("allow", 320, 180, seed=10 * n + i) for i in range(FRAMES)))

    bodies = {
        f"video-{n}": {"video_id": f"video-{n}", "frames": frames(n), "webhook_url": webhook_receiver.url}
        for n in range(JOBS)
    }
    state = redis.Redis.from_url(redis_url)

    def submit_all(url: str) -> dict[str, str]:
        with httpx.Client(base_url=url, timeout=30) as client:
            answers = {
                key: client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                for key, body in bodies.items()
            }
        assert {a.status_code for a in answers.values()} == {202}
        return {key: answer.json()["id"] for key, answer in answers.items()}

    def statuses(ids: dict[str, str]) -> list[str]:
        found = [state.hget(RedisJobStore.job_key(job_id), "status") for job_id in ids.values()]
        return [(status or b"gone").decode() for status in found]

    first = gateway_process(**env)
    ids = submit_all(first.url)
    poll(lambda: "running" in statuses(ids), 30, "a job to be running")
    first.kill()
    at_kill = statuses(ids)
    assert "running" in at_kill
    assert at_kill.count("succeeded") < JOBS

    second = gateway_process(**env)
    assert submit_all(second.url) == ids  # the same keys answer the same jobs: nothing submitted twice
    poll(lambda: statuses(ids) == ["succeeded"] * JOBS, 120, "every job to succeed", every_s=0.2)
    poll(
        lambda: state.xlen(STREAM) == 0 and state.xpending(STREAM, GROUP)["pending"] == 0,
        30,
        "every stream entry to be acknowledged",
    )
    poll(lambda: len(webhook_receiver.by_job()) == JOBS, 30, "a webhook for every job")

    records = [state.hgetall(RedisJobStore.job_key(job_id)) for job_id in ids.values()]
    assert [r[b"completions"] for r in records] == [b"1"] * JOBS  # completed exactly once per key
    assert max(int(r[b"attempts"]) for r in records) >= 2  # a job cut off by the kill was worked again
    with httpx.Client(base_url=second.url, timeout=30) as client:
        results = [client.get(f"/v1/jobs/{job_id}").json()["result"]["frames"] for job_id in ids.values()]
    assert [len(r) for r in results] == [FRAMES] * JOBS
    for job_id, deliveries in webhook_receiver.by_job().items():
        assert job_id in ids.values()
        # At least once; a repeat (the kill landing between the receiver's answer and the gateway's record
        # of it) carries the same delivery id and the same finished job.
        assert len({d.json()["result"]["id"] for d in deliveries}) == 1
        for delivery in deliveries:
            assert verify_webhook(WEBHOOK_SECRET, delivery.headers["x-modgate-signature"], delivery.body)
    state.close()
