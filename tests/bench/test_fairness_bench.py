"""``bench/fairness.py`` end to end with tiny counts: its figures hold together, and under one shared queue
the quiet tenant waits behind the flood's backlog while under the per-tenant queue it does not."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import fairness


def test_the_fairness_benchmarks_figures_hold_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "fairness.json"
    fairness.main(["--time-scale", "0.05", "--waiting", "12", "--b-keyframes", "3", "--fifo-b-keyframes", "2",
                   "--alone-keyframes", "2", "--frame-pool", "8", "--json", str(report)])
    printed = capsys.readouterr().out
    saved = json.loads(report.read_text())
    assert "throughput tenant / fifo" in printed
    fair, fifo = saved["runs"]["tenant"], saved["runs"]["fifo"]
    assert fair["b_keyframes"] == 3
    assert fifo["b_keyframes"] == 2
    for run in (fair, fifo):
        assert run["errors"] == 0
        assert run["b_p50_s"] <= run["b_p95_s"]
        assert run["b_queue_p95_s"] <= run["b_p95_s"]
        assert run["a_keyframes"] > 0
        assert math.isfinite(run["throughput_per_min"])
    # one shared queue: B's every keyframe waits behind A's 12; per tenant it waits for a slot, not for them
    assert fifo["b_queue_p50_s"] > fair["b_queue_p50_s"]
    assert saved["ratios"]["fifo_b_p95_over_a_median"] > saved["ratios"]["tenant_b_p95_over_a_median"]
