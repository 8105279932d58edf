"""``bench/capacity.py`` runs end to end with tiny counts and prints its tables (figures, never judged)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import capacity, plots


def test_the_capacity_benchmark_prints_the_calibration_and_a_row_per_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "capacity.json"
    capacity.main(["--time-scale", "0.02", "--keyframes", "4", "--warmup", "1", "--rates", "60", "600",
                   "--frame-pool", "8", "--calibration-clients", "2",
                   "--config", "baseline", "off-packing-4", "--json", str(report)])
    printed = capsys.readouterr().out
    assert re.search(r"keyframes/min\s+46\.700\s+\S+\s+\S+", printed)
    assert re.search(r"TTFT mean \(s\)\s+0\.468\s+\S+\s+\S+", printed)
    assert re.search(r"end to end mean \(s\)\s+8\.560\s+\S+\s+\S+", printed)
    rows = {line.split()[0]: line.split() for line in printed.splitlines()
            if line.split() and line.split()[0] in ("baseline", "off-packing-4") and "/min" not in line}
    assert set(rows) == {"baseline", "off-packing-4"}
    saved = json.loads(report.read_text())
    assert [row["name"] for row in saved["configurations"]] == ["baseline", "off-packing-4"]
    packed = saved["configurations"][1]
    assert packed["points"][0]["keyframes"] >= 4  # keyframes counted, four to a request
    assert set(saved["calibration"]) >= {"achieved_per_min", "ttft_mean_s", "e2e_mean_s"}
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
