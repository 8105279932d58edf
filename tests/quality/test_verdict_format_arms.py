"""The verdict format as a quality arm: the runner asks for each form, the report compares them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx

from contracts.records import JsonlRecordStore, format_iso_week
from deploy.keyframes import make_keyframe
from quality.report import ReportPolicy, build_weekly_report, render_html, render_markdown
from quality.runner import load_dataset, run_offline
from tests.support import GatewayFactory, SimFactory

LABELS = ("allow", "allow", "block:violence", "review", "allow", "block:hate")


async def test_compact_and_json_arms_are_run_recorded_and_compared(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    sim = start_sim(thinking_off_disagreement=0.3)
    gateway = start_gateway(engine_url=sim.url, shaping={"verdict_cache_ttl_s": 0})
    frames = tmp_path / "frames"
    for index in range(24):
        video = frames / f"video-{index % 4}"
        video.mkdir(parents=True, exist_ok=True)
        label = LABELS[index % len(LABELS)]
        (video / f"{index:03d}.jpg").write_bytes(make_keyframe(label, 320, 180, seed=300 + index))
    store = JsonlRecordStore(tmp_path / "records")
    arms = ["thinking_on", "thinking_off", "thinking_off_json"]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
        summary = await run_offline(load_dataset(frames), arms, client=client, store=store, concurrency=2)
    records = await store.read_range(None, None)
    await store.aclose()
    assert summary.sent == dict.fromkeys(arms, 24), summary.errors
    by_arm = {arm: [r for r in records if r.arm == arm] for arm in arms}
    # every verdict carries the engine's confidence; the JSON form costs its extra tokens (about ten more
    # in Qwen's real BPE, which the simulator counts with)
    assert all(r.confidence is not None for r in records)
    compact_tokens = max(r.completion_tokens for r in by_arm["thinking_off"])
    assert compact_tokens <= 6
    assert min(r.completion_tokens for r in by_arm["thinking_off_json"]) > 2 * compact_tokens

    week = format_iso_week(*datetime.now(UTC).isocalendar()[:2])
    report = build_weekly_report(records, week, ReportPolicy(bootstrap_resamples=200))
    compared = {(c.reference, c.candidate): c for c in report.format_comparisons}
    assert set(compared) == {("thinking_off_json", "thinking_off"), ("thinking_on", "thinking_off_json")}
    # the simulator's verdict does not depend on the form it is written in; thinking off does change some
    assert compared["thinking_off_json", "thinking_off"].agreement.value == 1.0
    assert report.comparison is not None
    assert (
        compared["thinking_on", "thinking_off_json"].agreement.value == report.comparison.agreement.value < 1
    )
    assert {cost.arm for cost in report.costs} == set(arms)
    assert "## Verdict format" in render_markdown(report)
    assert "Verdict format" in render_html(report)
