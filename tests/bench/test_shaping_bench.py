"""``bench/shaping.py``: the requests it sends for each verdict format, and its figures, table, JSON and plot
from measured windows (made up here: the bench itself takes minutes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import plots
from bench import shaping as bench
from shaping.image import ShapedImage
from shaping.prompt import load_system_prompt, prompt_version_for
from shaping.verdict import VerdictFormat, structured_outputs

REPOSITORY = Path(__file__).resolve().parents[2]
PRESET = {"prefill_tokens_per_s": 3500.0, "decode_tokens_per_s": 96.0, "block_size": 2960}
COST = {"1280x720": (20.0, 30.0), "1920x1080": (25.0, 40.0)}


@pytest.fixture(scope="module")
def frames() -> list[ShapedImage]:
    return bench.keyframes(660, 4)


@pytest.mark.parametrize("verdict_format", ["compact", "json"])
def test_each_request_asks_for_the_verdict_format_of_its_system_prompt(
    frames: list[ShapedImage], verdict_format: VerdictFormat
) -> None:
    system = load_system_prompt(prompt_version_for(verdict_format))
    body = bench.request_body(system, frames[:2], bench.Option("K=2", packing=2), verdict_format)
    constraint = {key: body[key] for key in ("structured_outputs", "response_format") if key in body}
    assert constraint == structured_outputs(verdict_format, "json_schema", 2)
    assert body["messages"][0]["content"] == system.text


def test_the_requests_ask_for_the_compact_verdict_by_default(frames: list[ShapedImage]) -> None:
    system = load_system_prompt(prompt_version_for("compact"))
    option = bench.Option("seed")
    default = bench.request_body(system, frames[:1], option)
    assert default == bench.request_body(system, frames[:1], option, "compact")


def measured_rows() -> list[bench.Row]:
    """The seed and an option twice as fast per keyframe, over a 45 s window at time scale 0.25 (180 s of
    Spark time), and one option none of whose requests finished inside the window."""
    seed = bench.Run(frames=135, requests=135, prompt_tokens=135 * 1036, completion_tokens=135 * 72,
                     elapsed_s=45.0, e2e_s=[2.0, 2.5, 3.0])
    fast = bench.Run(frames=270, requests=270, prompt_tokens=270 * 3300, cached_tokens=270 * 2960,
                     completion_tokens=270 * 4, elapsed_s=45.0, e2e_s=[0.5, 0.6])
    return [
        (bench.Option("seed"), seed, COST),
        (bench.Option("off + fill", fill=True, thinking=False), fast, COST),
        (bench.Option("none finished", packing=4), bench.Run(elapsed_s=45.0), COST),
    ]


def test_the_figures_are_per_keyframe_at_the_sparks_pace() -> None:
    seed, fast, none = bench.figures(measured_rows(), 0.25, PRESET)
    assert seed["keyframes_per_min"] == pytest.approx(45.0)  # 135 frames in 180 s of Spark time
    assert seed["uncached_prefill_tokens_per_frame"] == 1036
    assert seed["output_tokens_per_frame"] == 72
    assert seed["model_bound_per_min"] == pytest.approx(60 / (1036 / 3500 + 72 / 96))
    assert seed["e2e_p50_s"] == pytest.approx(2.5 / 0.25)
    assert fast["uncached_prefill_tokens_per_frame"] == 340
    assert fast["ratio_to_seed"] == pytest.approx(2.0)
    assert fast["engine_prefill_s_per_frame"] == pytest.approx(340 / 3500)
    assert fast["engine_decode_s_per_frame"] == pytest.approx(4 / 96)
    assert none["keyframes_per_min"] == 0
    assert math.isnan(none["model_bound_per_min"])
    assert none["e2e_p50_s"] is None


def test_the_table_json_and_plots_come_from_the_same_figures(tmp_path: Path) -> None:
    rows = bench.figures(measured_rows(), 0.25, PRESET)
    table = bench.table(rows, markdown=True)
    assert "| seed | 646 | 1,036 | 72.0 | 45.0 (1.00x) | 57 | 20.0 / 30.0 | 25.0 / 40.0 |" in table
    assert "| off + fill | 646 | 340 | 4.0 | 90.0 (2.00x) |" in table
    setup = {"time_scale": 0.25, "clients": 16, "verdict_format": "compact", "cpus": 2, "load_before": [1.0],
             "load_after": [2.0], **PRESET}
    path = tmp_path / "shaping.json"
    path.write_text(json.dumps({"setup": setup, "rows": rows}))
    capacity = tmp_path / "capacity-compact.json"
    capacity.write_text((REPOSITORY / "docs/bench/capacity-compact.json").read_text())
    plots.main(["--overhead", str(tmp_path / "none.json"), "--capacity", str(capacity),
                "--shaping", str(path), "--out", str(tmp_path)])
    assert (tmp_path / "shaping.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "capacity-compact.png").read_bytes().startswith(b"\x89PNG")  # named after its report
