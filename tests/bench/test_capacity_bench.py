"""``bench/capacity.py`` end to end with tiny counts: its figures satisfy what any true figures must."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from bench import capacity, plots


def test_the_capacity_benchmarks_figures_hold_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "capacity.json"
    capacity.main(["--time-scale", "0.02", "--keyframes", "8", "--warmup", "1", "--rates", "60", "600",
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
