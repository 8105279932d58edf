"""Behind Sentinel, accepted means replicated: with a ``redis+sentinel://`` URL a job, a review item and a
decision-log append wait for one replica unless ``WAIT_REPLICAS`` says otherwise (a 202 given before a
replica held the job was lost in a failover), and the price is a write refused while no replica answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.cluster import SentinelFleet
from deploy.keyframes import make_keyframe
from gateway.settings import RedisSettings, Settings
from tests.support import GatewayFactory, SimFactory, image_input

SENTINEL_URL = "redis+sentinel://127.0.0.1:26379/modgate/0"
JOB = {"video_id": "video-1", "frames": image_input(make_keyframe("allow", 320, 180, seed=5))}


def waits(settings: Settings) -> tuple[int, int, int]:
    return settings.jobs.wait_replicas, settings.review.wait_replicas, settings.decisions.wait_replicas


def test_behind_sentinel_jobs_review_items_and_decisions_wait_for_one_replica_by_default() -> None:
    assert waits(Settings(redis=RedisSettings(url=SENTINEL_URL))) == (1, 1, 1)
    assert waits(Settings(redis=RedisSettings(url="redis://127.0.0.1:6379/0"))) == (0, 0, 0)
    assert waits(Settings()) == (0, 0, 0)


def test_a_wait_replicas_set_behind_sentinel_stands_zero_included(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODGATE_REDIS__URL", SENTINEL_URL)
    monkeypatch.setenv("MODGATE_REVIEW__WAIT_REPLICAS", "0")
    monkeypatch.setenv("MODGATE_JOBS__WAIT_REPLICAS", "2")
    assert waits(Settings()) == (2, 0, 1)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[SentinelFleet]:
    """A primary, one replica and one sentinel."""
    started = SentinelFleet(tmp_path / "redis", replicas=1, sentinels=1)
    try:
        yield started.start()
    finally:
        started.stop()


@pytest.mark.redis
def test_behind_sentinel_a_job_is_accepted_once_a_replica_holds_it_and_refused_while_none_answers(
    fleet: SentinelFleet, start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim()
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": fleet.url})  # WAIT_REPLICAS left unset
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        deadline = time.monotonic() + 30
        accepted = client.post("/v1/jobs", json=JOB)
        while accepted.status_code != 202 and time.monotonic() < deadline:  # the replica's first sync
            time.sleep(0.2)
            accepted = client.post("/v1/jobs", json=JOB)
        assert accepted.status_code == 202, accepted.text
        fleet.servers[1].stop()  # the only replica gone: the primary alone cannot make a job durable
        refused = client.post("/v1/jobs", json=JOB)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "state_unavailable"
