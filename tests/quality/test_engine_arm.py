"""The engine as an arm: records carry their engine; the runner judges every frame on two engines and the
weekly report compares one engine's verdicts with the other's (issue 26, part 5)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx

from contracts.records import JsonlRecordStore, VerdictRecord, format_iso_week
from contracts.summaries import ENGINE_NAMES, EngineKind
from deploy.keyframes import make_keyframe
from quality.report import ReportPolicy, build_weekly_report, render_html, render_markdown
from quality.runner import load_dataset, run_offline
from tests.quality.fakes import synthesize_week
from tests.quality.test_report_headline import CATEGORIES, crafted_week
from tests.support import GatewayFactory, SimFactory

POLICY = ReportPolicy(bootstrap_resamples=200)
LABELS = ("allow", "allow", "block:violence", "review", "allow", "block:hate")


def _second_engine(records: list[VerdictRecord], flip_every: int) -> list[VerdictRecord]:
    """llama.cpp's verdicts on the same frames: thinking off again, flipping every `flip_every`-th frame."""
    copies = []
    for index, record in enumerate(r for r in records if r.arm == "thinking_off"):
        flagged = not record.flagged if index % flip_every == 0 else record.flagged
        copies.append(
            record.model_copy(
                update={
                    "engine": "llamacpp",
                    "flagged": flagged,
                    "action": "block" if flagged else "allow",
                    "categories": record.categories if flagged else [],
                    "request_id": record.request_id + "-llamacpp",
                }
            )
        )
    return copies


def test_every_engine_kind_the_command_line_accepts_has_the_name_the_report_gives_it() -> None:
    assert set(ENGINE_NAMES) == {kind.value for kind in EngineKind}
    assert ENGINE_NAMES["llamacpp"] == "llama.cpp"


def test_a_week_of_one_engine_has_no_engine_section() -> None:
    week = synthesize_week(frames=600, videos=60, seed=3)
    report = build_weekly_report(week.records, "2026-W48", POLICY)
    assert report.engines is None
    assert "## Engines" not in render_markdown(report)


def test_a_second_engines_verdicts_are_compared_with_the_first_and_leave_the_thinking_report_alone() -> None:
    week = synthesize_week(frames=2000, videos=200, seed=4)
    alone = build_weekly_report(week.records, "2026-W48", POLICY)
    both = build_weekly_report([*week.records, *_second_engine(week.records, 10)], "2026-W48", POLICY)
    section = both.engines
    assert section is not None
    assert (section.reference_engine, section.candidate_engine) == ("vllm", "llamacpp")
    assert [item.arm for item in section.comparisons] == ["thinking_off"]
    engine = section.comparisons[0].comparison
    assert engine.frames == 2000
    assert engine.agreement.value == 0.9  # every tenth frame flipped
    assert section.decision == "keep_reference"
    assert section.headline.endswith("Keep vLLM.")
    # the thinking on/off comparison is the vLLM one, as without the second engine's records
    assert both.comparison == alone.comparison
    assert both.categories == alone.categories
    assert both.data.records == alone.data.records + 2000
    markdown, html = render_markdown(both), render_html(both)
    assert "## Engines: llama.cpp against vLLM" in markdown
    assert section.headline in markdown
    assert "Engines: llama.cpp against vLLM" in html


def test_a_second_engine_that_agrees_within_the_policy_may_replace_the_first() -> None:
    # enough flagged frames (about 100 a category) that every category's interval can clear the minimum
    week = synthesize_week(frames=4000, videos=400, flag_rate=0.12, seed=5)
    both = build_weekly_report([*week.records, *_second_engine(week.records, 1000)], "2026-W48", POLICY)
    assert both.engines is not None
    print(f"\n{both.engines.headline}")
    assert both.engines.decision == "switch_ok"
    assert both.engines.comparisons[0].comparison.agreement.value > 0.99


async def test_the_runner_judges_every_frame_on_two_engines_and_the_report_compares_them(
    start_sim: SimFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    """Two simulators behind two gateways: the second's thinking off differs on more frames."""
    first = start_gateway(engine_url=start_sim().url, shaping={"verdict_cache_ttl_s": 0})
    second = start_gateway(
        engine_url=start_sim(thinking_off_disagreement=0.4).url, shaping={"verdict_cache_ttl_s": 0}
    )
    frames = tmp_path / "frames"
    for index in range(24):
        video = frames / f"video-{index % 4}"
        video.mkdir(parents=True, exist_ok=True)
        label = LABELS[index % len(LABELS)]
        (video / f"{index:03d}.jpg").write_bytes(make_keyframe(label, 320, 180, seed=500 + index))
    store = JsonlRecordStore(tmp_path / "records")
    arms = ["thinking_on", "thinking_off"]
    async with (
        httpx.AsyncClient(base_url=first.url, timeout=60) as client,
        httpx.AsyncClient(base_url=second.url, timeout=60) as other,
    ):
        summary = await run_offline(
            load_dataset(frames),
            arms,
            client=client,
            store=store,
            concurrency=2,
            other_engines=[("llamacpp", other)],
        )
        again = await run_offline(
            load_dataset(frames), arms, client=client, store=store, other_engines=[("llamacpp", other)]
        )
    records = await store.read_range(None, None)
    await store.aclose()
    assert summary.sent == {f"{arm}@{engine}": 24 for arm in arms for engine in ("vllm", "llamacpp")}
    assert sum(again.skipped.values()) == 96  # resumed per engine too
    assert sum(again.sent.values()) == 0
    assert {r.engine for r in records} == {"vllm", "llamacpp"}

    week = format_iso_week(*datetime.now(UTC).isocalendar()[:2])
    report = build_weekly_report(records, week, POLICY)
    section = report.engines
    assert section is not None
    by_arm = {item.arm: item.comparison for item in section.comparisons}
    assert set(by_arm) == {"thinking_on", "thinking_off"}
    assert all(c.frames == 24 for c in by_arm.values())
    # both simulators answer thinking on from the frame's truth; their thinking off differs
    assert by_arm["thinking_on"].agreement.value == 1.0
    assert by_arm["thinking_off"].agreement.value < POLICY.min_agreement
    assert section.decision == "keep_reference"
    assert report.comparison is not None
    assert report.comparison.frames == 24  # the thinking comparison is the first engine's alone


def _engine_week(failing: set[str], **kwargs: int) -> list[VerdictRecord]:
    """The crafted headline week as two engines on thinking off: vLLM says what thinking on said there,
    llama.cpp what thinking off said (the same frames flagged, the next category named where `failing`)."""
    records = []
    for record in crafted_week(failing, **kwargs):
        if record.arm == "thinking_on":
            records.append(record.model_copy(update={"arm": "thinking_off"}))
        else:
            request_id = record.request_id + "-llamacpp"
            records.append(record.model_copy(update={"engine": "llamacpp", "request_id": request_id}))
    return records


def test_an_engine_that_names_the_wrong_category_on_most_blocked_frames_keeps_the_reference() -> None:
    report = build_weekly_report(_engine_week(set(CATEGORIES)), "2026-W48", POLICY)
    section = report.engines
    assert section is not None
    comparison = section.comparisons[0].comparison
    assert comparison.agreement.low >= POLICY.min_agreement  # the action alone would pass
    assert comparison.flagged_agreement is not None
    assert comparison.flagged_agreement.low >= POLICY.min_flagged_agreement
    print(f"\n{section.headline}")
    assert section.decision == "keep_reference"
    assert "every category judged (6) is below the 90 % flagged minimum" in section.headline
    assert section.headline.endswith("Keep vLLM.")
    assert "Keep vLLM" in render_markdown(report)


def test_an_engine_whose_category_interval_reaches_below_the_minimum_is_inconclusive() -> None:
    section = build_weekly_report(_engine_week({"hate"}, renamed_of_20=1), "2026-W48", POLICY).engines
    assert section is not None
    print(f"\n{section.headline}")
    assert section.decision == "inconclusive"
    assert "hate 95.0 %" in section.headline


def test_an_engine_that_agrees_on_every_category_may_replace_the_reference() -> None:
    section = build_weekly_report(_engine_week(set()), "2026-W48", POLICY).engines
    assert section is not None
    assert section.decision == "switch_ok"
    assert "every category judged (6) meets the flagged minimum" in section.headline
