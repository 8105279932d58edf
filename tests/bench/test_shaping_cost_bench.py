"""``bench/shaping_cost.py`` with tiny counts: its figures checked against each other, never a time."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from bench import shaping_cost


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return shaping_cost.main(["--rounds", "15", "--identity-frames", "4"])


def test_the_floor_is_printed_beside_each_off_grid_size(
    report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    shaping_cost.main(["--rounds", "2", "--identity-frames", "0"])
    printed = capsys.readouterr().out
    for size in ("1280×720", "1920×1080"):
        assert re.search(rf"^{size}, \d+ KiB → 1088×608", printed, re.MULTILINE)
    assert len(re.findall(r"^  floor: decode \+ .+ \+ encode +\d+\.\d+$", printed, re.MULTILINE)) == 2
    assert len(re.findall(r"shape_image / floor = \d+\.\d+×", printed)) == 2


def test_the_floor_and_the_shaped_cost_are_measured_for_each_off_grid_size(report: dict[str, Any]) -> None:
    # both are printed side by side for every off-grid size, as measured figures (no wall-clock comparison
    # between two noisy timings: the bench prints their ratio for a person to read)
    for result in report["off_grid"].values():
        assert math.isfinite(result["floor_ms"])
        assert result["floor_ms"] > 0
        assert math.isfinite(result["median_ms"]["shape_image"])
        assert result["median_ms"]["shape_image"] > 0


def test_the_floor_uses_the_fastest_resize_the_engine_could_not_tell_from_bicubic(
    report: dict[str, Any],
) -> None:
    for result in report["off_grid"].values():
        quality, threshold = result["quality_db"], result["threshold_db"]
        acceptable = [
            name for name, db in quality.items() if db >= threshold and not name.startswith("shaping")
        ]
        assert result["floor_resize"] in acceptable
        assert quality["OpenCV nearest"] < threshold  # the criterion does refuse something
        assert quality["shaping: Pillow bilinear, reducing_gap 2"] >= threshold  # what shaping does passes it
        resize_ms = {name: result["median_ms"][f"resize: {name}"] for name in acceptable}
        assert resize_ms[result["floor_resize"]] == min(resize_ms.values())


def test_the_fast_paths_decode_no_more_than_they_must(report: dict[str, Any]) -> None:
    fast = report["fast_path"]
    half = fast["2176×1216 (2× target: DCT half-scale)"]["shaped"]
    passthrough = fast["1088×608 (on the grid: passthrough)"]["shaped"]
    assert (half.decoded_size, half.passthrough) == ((1088, 608), False)
    assert (passthrough.decoded_size, passthrough.passthrough) == ((136, 76), True)
    # a passthrough frame is decoded at 1/8 scale only (the sizes above); its times are printed, not compared
    times = fast["1088×608 (on the grid: passthrough)"]["median_ms"]
    assert {"decode at 1/8", "shape_image", "decode only"} <= set(times)


def test_the_identity_spread_counts_every_frame(report: dict[str, Any]) -> None:
    spread = report["identity"]
    assert sum(spread["phash_bits"].values()) == sum(spread["thumbnail_levels"].values()) == 4
