"""Shadow pairs to a second engine (MODGATE_SHADOW__ENGINE_URL): the live mode and format, the engine's kind
recorded, one engine's verdicts paired with the other's. Two simulators stand in for the two engines."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from contracts.records import VerdictRecord
from deploy.keyframes import make_keyframe
from deploy.simulator.llamacpp_law import LlamaCppOptions
from gateway.settings import Settings
from tests.shadow.test_shadow_pairs import post_frames, read_records, set_shadow_share, shadow_counts
from tests.support import GatewayFactory, SimFactory


def finished_requests(engine_url: str) -> float:
    text = httpx.get(f"{engine_url}/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "vllm:request_success_total")


def llamacpp_prompt_tokens(engine_url: str) -> float:
    """Every prompt token a llama-server was sent: processed plus reused from its cache."""
    text = httpx.get(f"{engine_url}/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"))


def by_engine(records: list[VerdictRecord], engine: str) -> list[VerdictRecord]:
    return [record for record in records if record.engine == engine]


async def test_the_shadow_share_is_judged_on_the_second_engine_in_the_live_mode_with_its_kind_recorded(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    # the second is a llama.cpp server (4 slots) with a model of its own; its kind is detected (GET /props)
    live = start_sim()
    second = start_sim(kind="llamacpp", llamacpp=LlamaCppOptions(n_parallel=4), model="moderation-vlm-gguf")
    gateway = start_gateway(
        engine_url=live.url, quality={"records_dir": str(tmp_path)}, shaping={"verdict_cache_ttl_s": 0},
        shadow={"engine_url": second.url},
    )
    set_shadow_share(gateway, 1.0)
    labels = ["allow", "block:violence", "review", "allow"]
    frames = [make_keyframe(labels[i % 4], 256, 144, seed=300 + i) for i in range(12)]
    # One frame at a time: a second engine still busy with the last frame would be skipped (and counted).
    for index, frame in enumerate(frames):
        answers = await post_frames(gateway, [frame], concurrency=1)
        assert answers[0]["thinking"] == "on"
        # Per frame: the live verdict, the other mode on the live engine, the live mode on the second engine.
        records = await read_records(tmp_path, expected=3 * (index + 1))
    assert len(records) == 3 * 12, (shadow_counts(gateway), [(r.engine, r.arm) for r in records])
    vllm, llamacpp = by_engine(records, "vllm"), by_engine(records, "llamacpp")
    assert sorted(r.arm for r in vllm) == ["thinking_off"] * 12 + ["thinking_on"] * 12
    assert [r.arm for r in llamacpp] == ["thinking_on"] * 12  # the live mode and format, not the other
    assert {r.frame_sha256 for r in llamacpp} == {r.frame_sha256 for r in vllm}
    live_on = {r.frame_sha256: r for r in vllm if r.arm == "thinking_on"}
    for record in llamacpp:
        # The same simulated ground truth on both engines: one engine's verdict matches the other's.
        assert record.action == live_on[record.frame_sha256].action
        assert record.selection == "random"
    # every drawn frame went to the second engine once: its prompt tokens (processed, reused) are the records'
    assert llamacpp_prompt_tokens(second.url) == sum(r.prompt_tokens for r in llamacpp)
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
