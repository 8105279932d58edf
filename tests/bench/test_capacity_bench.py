"""``bench/capacity.py`` end to end with tiny counts: its figures satisfy what any true figures must."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest

from bench import capacity, plots


def test_the_capacity_benchmarks_figures_hold_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "capacity.json"
    capacity.main(["--time-scale", "0.02", "--keyframes", "8", "--warmup", "1", "--rates", "20", "600",
                   "--frame-pool", "8", "--calibration-clients", "2",
                   "--config", "baseline", "off-packing-4", "--json", str(report)])
    printed = capsys.readouterr().out
    saved = json.loads(report.read_text())
    assert [row["name"] for row in saved["configurations"]] == ["baseline", "off-packing-4"]
    rows = {line.split()[0] for line in printed.splitlines()
            if line.split() and line.split()[0] in ("baseline", "off-packing-4") and "/min" not in line}
    assert rows == {"baseline", "off-packing-4"}
    calibration = saved["calibration"]
    for key in ("achieved_per_min", "ttft_mean_s", "e2e_mean_s"):
        assert math.isfinite(calibration[key])
        assert calibration[key] > 0
    assert calibration["ttft_mean_s"] < calibration["e2e_mean_s"]
    for row in saved["configurations"]:
        points = row["points"]
        # Two requests at least per rate (four keyframes to a request when packed): every rate is finite.
        assert all(math.isfinite(p["achieved_per_min"]) for p in points)
        assert row["max_achieved_per_min"] == max(p["achieved_per_min"] for p in points)
        if row["sustained_per_min"] is not None:  # a rate met under the SLO was a rate the engine finished
            assert row["sustained_per_min"] <= row["max_achieved_per_min"]
        for point in points:
            assert point["e2e_p50_s"] <= point["e2e_p95_s"]
            assert point["ttft_p50_s"] <= point["e2e_p95_s"]
        # 600/min is past either configuration's capacity: latency rises with the load, never falls.
        for lighter, heavier in itertools.pairwise(points):
            assert heavier["offered_per_min"] > lighter["offered_per_min"]
            assert heavier["e2e_p50_s"] >= lighter["e2e_p50_s"]
    packed = saved["configurations"][1]
    assert packed["points"][0]["keyframes"] >= 8  # keyframes counted, four to a request
    assert plots.plot_capacity(saved, tmp_path).read_bytes().startswith(b"\x89PNG")


def test_a_configuration_needing_a_setting_the_gateway_lacks_is_reported_as_skipped() -> None:
    lacking = capacity.Configuration("x", "x", "off", {"MODGATE_SHAPING__NO_SUCH_KNOB": "1"})
    assert lacking.missing_settings() == ["MODGATE_SHAPING__NO_SUCH_KNOB"]
    assert all(not config.missing_settings() for config in capacity.CONFIGURATIONS)


def test_the_escalate_configurations_report_fast_and_escalated_latency_and_agreement_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "capacity.json"
    capacity.main(["--time-scale", "0.02", "--keyframes", "6", "--warmup", "1", "--rates", "60",
                   "--escalate-pool", "12", "--truth-frames", "3000",
                   "--config", "escalate-0.75", "escalate-0.95", "--json", str(report)])
    printed = capsys.readouterr().out
    assert re.search(r"escalate below 0\.\d+ \(the report's recommendation", printed)
    for line in ("p95 answered fast (s)", "p95 escalated (s)", "agreement (measured)",
                 "agreement (ground truth)"):
        assert re.search(rf"{re.escape(line)}(\s+\S+){{2}}$", printed, re.MULTILINE), line
    saved = json.loads(report.read_text())
    rows = saved["configurations"]
    assert [row["separation"] for row in rows] == [0.75, 0.95]
    for row in rows:
        assert {"fast_p95_s", "escalated_p95_s", "escalated_share", "agreement"} <= set(row)
        assert 0 <= row["agreement"] <= 1
    expected = saved["escalation"]["expected"]
    # one threshold for every separation: the better separated model recovers more of its disagreements
    assert expected["0.95"]["agreement"] > expected["0.75"]["agreement"]
    assert saved["escalation"]["table"]["rows"]
