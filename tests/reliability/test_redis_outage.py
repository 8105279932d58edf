"""Redis stopped and restarted under a working gateway: job calls answer 503 meanwhile, live moderation goes
on, and once Redis is back every job (those in flight included) finishes exactly once."""

from __future__ import annotations

from typing import Any

import httpx
import redis

from deploy.keyframes import make_keyframe
from gateway.jobs.store_redis import RedisJobStore
from tests.processes import RedisServer, poll
from tests.reliability.conftest import error_body
from tests.support import GatewayFactory, SimFactory, image_input


def job_body(n: int) -> dict[str, Any]:
    frames = [make_keyframe("allow", 320, 180, seed=100 + 3 * n + i) for i in range(3)]
    return {"video_id": f"video-{n}", "frames": image_input(*frames)}


def test_jobs_finish_exactly_once_across_a_redis_restart(
    start_sim: SimFactory, start_gateway: GatewayFactory, own_redis: RedisServer
) -> None:
    sim = start_sim("spark", time_scale=0.2)
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": own_redis.url}, jobs={"claim_idle_s": 2})
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        ids = [
            client.post("/v1/jobs", json=job_body(n), headers={"Idempotency-Key": f"k{n}"}).json()["id"]
            for n in range(4)
        ]
        poll(lambda: client.get(f"/v1/jobs/{ids[0]}").json()["status"] == "running", 30, "a running job")

        own_redis.stop()
        refused = client.post("/v1/jobs", json=job_body(9))
        assert refused.status_code == 503
        assert error_body(refused)["code"] == "state_unavailable"
        assert int(refused.headers["retry-after"]) >= 1  # a 503 says when to come back
        assert client.get(f"/v1/jobs/{ids[0]}").status_code == 503
        frame = make_keyframe("block:violence", 320, 180)
        live = client.post("/v1/moderations", json={"input": image_input(frame)})
        assert live.status_code == 200  # moderation does not need Redis
        assert live.json()["results"][0]["modgate"]["action"] == "block"
        assert client.get("/healthz").status_code == 200

        def engine_idle() -> bool:
            info = client.get(f"{sim.url}/sim/info").json()
            return bool(info["running"] == 0 and info["waiting"] == 0)

        # The jobs that were running finish their engine work while Redis is still down.
        poll(engine_idle, 30, "the engine to finish the running jobs' frames")
        own_redis.start()  # same port, same append-only file

        def submitted() -> httpx.Response | None:
            answer = client.post("/v1/jobs", json=job_body(4), headers={"Idempotency-Key": "k4"})
            return answer if answer.status_code == 202 else None

        late = poll(submitted, 30, "job submissions to work again", every_s=0.2)
        ids.append(late.json()["id"])

        def all_done() -> bool:
            answers = [client.get(f"/v1/jobs/{job_id}") for job_id in ids]
            return all(a.status_code == 200 and a.json()["status"] == "succeeded" for a in answers)

        poll(all_done, 120, "every job to succeed after the restart", every_s=0.2)
    state = redis.Redis.from_url(own_redis.url)
    try:
        completions = [state.hget(RedisJobStore.job_key(job_id), "completions") for job_id in ids]
    finally:
        state.close()
    assert completions == [b"1"] * len(ids)
