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
