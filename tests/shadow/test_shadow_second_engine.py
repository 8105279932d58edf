"""Shadow pairs to a second engine (MODGATE_SHADOW__ENGINE_URL): the live mode and format, the engine's kind
recorded, one engine's verdicts paired with the other's. Two simulators stand in for the two engines."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from deploy.keyframes import make_keyframe
from gateway.settings import Settings
from quality.records import VerdictRecord
from tests.shadow.test_shadow_pairs import post_frames, read_records, set_shadow_share, shadow_counts
from tests.support import GatewayFactory, SimFactory


def finished_requests(engine_url: str) -> float:
    text = httpx.get(f"{engine_url}/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "vllm:request_success_total")


def by_engine(records: list[VerdictRecord], engine: str) -> list[VerdictRecord]:
    return [record for record in records if record.engine == engine]


async def test_the_shadow_share_is_judged_on_the_second_engine_in_the_live_mode_with_its_kind_recorded(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    live, second = start_sim(), start_sim(model="moderation-vlm-gguf")  # the second serves its own model
    gateway = start_gateway(
        engine_url=live.url, quality={"records_dir": str(tmp_path)}, shaping={"verdict_cache_ttl_s": 0},
        shadow={"engine_url": second.url, "engine_kind": "llamacpp"},
    )
    set_shadow_share(gateway, 1.0)
    labels = ["allow", "block:violence", "review", "allow"]
    frames = [make_keyframe(labels[i % 4], 256, 144, seed=300 + i) for i in range(12)]
    answers = await post_frames(gateway, frames, concurrency=2)
    assert all(answer["thinking"] == "on" for answer in answers)
    # Per frame: the live verdict, the other mode on the live engine, the live mode on the second engine.
    records = await read_records(tmp_path, expected=3 * 12)
    assert len(records) == 3 * 12
    vllm, llamacpp = by_engine(records, "vllm"), by_engine(records, "llamacpp")
    assert sorted(r.arm for r in vllm) == ["thinking_off"] * 12 + ["thinking_on"] * 12
    assert [r.arm for r in llamacpp] == ["thinking_on"] * 12  # the live mode and format, not the other
    assert {r.frame_sha256 for r in llamacpp} == {r.frame_sha256 for r in vllm}
    live_on = {r.frame_sha256: r for r in vllm if r.arm == "thinking_on"}
    for record in llamacpp:
        # The same simulated ground truth on both engines: one engine's verdict matches the other's.
        assert record.action == live_on[record.frame_sha256].action
        assert record.selection == "random"
    assert finished_requests(second.url) == 12  # every drawn frame went to the second engine once
    assert finished_requests(live.url) == 24  # live + the other-mode shadow; none of the second's work
    assert shadow_counts(gateway).get("recorded") == 12  # one write of the three records per frame


async def test_a_busy_second_engine_is_skipped_and_counted_while_the_live_pair_still_runs(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    live = start_sim()
    second = start_sim("spark", time_scale=0.05)  # slow: its one slot stays taken
    gateway = start_gateway(
        engine_url=live.url, quality={"records_dir": str(tmp_path)}, shaping={"verdict_cache_ttl_s": 0},
        shadow={"engine_url": second.url, "max_inflight": 1},
    )
    set_shadow_share(gateway, 1.0)
    frames = [make_keyframe("allow", 256, 144, seed=700 + i) for i in range(6)]
    await post_frames(gateway, frames, concurrency=3)
    counts = shadow_counts(gateway)
    assert counts.get("second_engine_skipped_busy", 0) > 0
    records = await read_records(tmp_path, expected=2 * 6)
    assert {r.arm for r in by_engine(records, "vllm")} == {"thinking_on", "thinking_off"}
    assert len(by_engine(records, "llamacpp")) < 6


def test_a_second_engine_url_must_be_http() -> None:
    with pytest.raises(ValidationError, match="MODGATE_SHADOW__ENGINE_URL must start with http"):
        Settings.model_validate({"shadow": {"engine_url": "llama:8000"}})
