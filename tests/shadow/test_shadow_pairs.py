"""Shadow pairs from live traffic: the other thinking mode on the same frame, only on spare capacity."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from cli.embedded import ThreadedServer
from contracts.records import JsonlRecordStore, VerdictRecord, iso_week_of, pair_records
from deploy.keyframes import make_keyframe
from quality.stats import wilson_interval
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def set_shadow_share(gateway: ThreadedServer, share: float) -> None:
    policy = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN).json()
    document = {k: v for k, v in policy.items() if k not in ("content_hash", "store")}
    document.update(shadow_share=share, reason="measure thinking off on live traffic")
    response = httpx.put(f"{gateway.url}/admin/thinking-policy", json=document, headers=ADMIN)
    assert response.status_code == 200, response.text


async def post_frames(gateway: ThreadedServer, frames: list[bytes], concurrency: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:

        async def post(frame: bytes, index: int) -> dict[str, Any]:
            async with gate:
                body = {"input": image_input(frame), "modgate": {"video_id": f"video-{index // 10}"}}
                response = await client.post("/v1/moderations", json=body)
                assert response.status_code == 200, response.text
                return dict(response.json()["results"][0]["modgate"])

        return await asyncio.gather(*(post(frame, i) for i, frame in enumerate(frames)))


async def read_records(directory: Path, expected: int, deadline_s: float = 60.0) -> list[VerdictRecord]:
    store = JsonlRecordStore(directory)
    year, week = iso_week_of(datetime.now(UTC))
    deadline = time.monotonic() + deadline_s
    records: list[VerdictRecord] = []
    while time.monotonic() < deadline:
        records = await store.read_week(year, week)
        if len(records) >= expected:
            break
        await asyncio.sleep(0.05)
    await store.aclose()
    return records


def shadow_counts(gateway: ThreadedServer) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{gateway.url}/metrics").text):
        for sample in family.samples:
            if sample.name == "modgate_shadow_pairs_total":
                counts[sample.labels["outcome"]] = sample.value
    return counts


async def test_the_simulators_disagreement_rate_is_recovered_from_live_shadow_pairs(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    sim = start_sim(thinking_off_disagreement=0.06)
    gateway = start_gateway(
        engine_url=sim.url, quality={"records_dir": str(tmp_path)}, shaping={"verdict_cache_ttl_s": 0}
    )
    set_shadow_share(gateway, 1.0)
    labels = ["allow"] * 7 + ["block:violence", "review", "block:sexual"]
    frames = [make_keyframe(labels[i % len(labels)], 256, 144, seed=1000 + i) for i in range(400)]
    answers = await post_frames(gateway, frames, concurrency=2)  # two live requests leave spare slots
    assert all(a["thinking"] == "on" for a in answers)
    records = await read_records(tmp_path, expected=2 * 400)
    pairing = pair_records(records, "thinking_on", "thinking_off")
    assert len(pairing.pairs) == 400  # every live frame found a spare slot for its shadow
    assert {r.source for r in records} == {"shadow"}
    agree = sum(p.reference.action == p.candidate.action for p in pairing.pairs)
    interval = wilson_interval(agree, len(pairing.pairs))
    print(f"shadow pairs: {agree}/{len(pairing.pairs)} agree, 95 % [{interval.low:.3f}, {interval.high:.3f}]")
    assert interval.low <= 0.94 <= interval.high, interval  # the simulator flips 6 % of frames
    assert {p.reference.video_id for p in pairing.pairs} == {f"video-{i}" for i in range(40)}


async def test_shadow_work_never_delays_live_requests_or_passes_the_cap(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    sim = start_sim("spark", time_scale=0.002, max_num_seqs=64)
    gateway = start_gateway(
        engine_url=sim.url, quality={"records_dir": str(tmp_path)}, shaping={"verdict_cache_ttl_s": 0}
    )
    set_shadow_share(gateway, 1.0)
    frames = [make_keyframe("allow", 256, 144, seed=i) for i in range(48)]
    await post_frames(gateway, frames, concurrency=16)  # more live work than slots: a queue forms
    info = httpx.get(f"{sim.url}/sim/info").json()
    assert info["peak_running"] <= 8
    counts = shadow_counts(gateway)
    assert counts.get("skipped_busy", 0) > 0  # with a queue, shadow work stood aside
    recorded = counts.get("recorded", 0)
    assert recorded + counts.get("skipped_busy", 0) <= 48


async def test_no_shadow_pairs_while_the_share_is_zero(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = start_gateway(engine_url=start_sim().url, quality={"records_dir": str(tmp_path)})
    await post_frames(gateway, [make_keyframe("allow", 256, 144, seed=i) for i in range(5)], concurrency=1)
    assert shadow_counts(gateway) == {}
    assert not list(tmp_path.glob("*.jsonl"))
