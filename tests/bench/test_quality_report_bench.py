"""bench/quality_report: the generated week is a valid week of records, and one small run reports."""

from __future__ import annotations

import pytest

from bench.quality_report import main
from bench.quality_week import week_table
from contracts.records import VerdictRecord
from quality.columnar import RECORD_SCHEMA


def test_the_generated_week_is_records_the_stores_accept() -> None:
    table = week_table(500, second_engine=0.2, seed=3)
    assert table.schema == RECORD_SCHEMA
    arms = set(table.column("arm").to_pylist())
    assert {"thinking_on", "thinking_off", "thinking_on_rerun", "thinking_off_json"} <= arms
    assert set(table.column("engine").to_pylist()) == {"vllm", "llamacpp"}
    for row in table.slice(0, 200).to_pylist():
        VerdictRecord.model_validate(row)  # every field within the record's own bounds


def test_one_small_run_prints_its_time_memory_and_the_machines_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--pairs", "3000", "--bootstrap", "100"]) == 0
    out = capsys.readouterr().out
    assert "generated 3,000 pairs" in out
    assert "s CPU, peak of the process tree at once" in out  # the SQL stage's child counted with the report
    assert "the report process's own VmHWM" in out
    assert "load average" in out
    assert "/usr/bin/time -v: " in out
    assert "maximum resident set" in out
    assert "headline: " in out
