"""`modgate deploy check` on fixture compose files: the seed's final Spark configuration passes; the Spark
fork's prefill-balancing flags are named with their measured cost; priority scheduling is required only
when the gateway sends priorities."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app as modgate_app
from deploy.check import CheckReport, check_deploy
from gateway.settings import Settings

SEED = Path(__file__).resolve().parent / "fixtures" / "seed"
FORK_KNOBS = (
    "--prefill-compute-share",
    "--prefill-compute-half-life",
    "--max-num-prefill-tokens-per-step",
    "--max-parallel-prefills",
    "--prefill-policy",
    "--decode-refill-target",
)


def check(*names: str) -> CheckReport:
    return check_deploy([SEED / name for name in names], environ={}, compose_config=False)


def line_of(path: Path, needle: str) -> int:
    (line,) = [n for n, text in enumerate(path.read_text().splitlines(), start=1) if needle in text]
    return line


def test_the_seeds_final_configuration_is_only_told_to_add_the_queue_backstop() -> None:
    report = check("compose.yaml")

    assert report.env_file == SEED / ".env"
    found = [(finding.severity, finding.rule) for finding in report.findings]
    assert found == [("warning", "queue-backstop")]


def test_modgate_deploy_check_passes_the_seeds_final_configuration() -> None:
    result = CliRunner().invoke(modgate_app, ["deploy", "check", str(SEED), "--skip-compose-config"])

    assert result.exit_code == 0, result.stdout
    assert "0 errors, 1 warning" in result.stdout


@pytest.mark.parametrize("knob", FORK_KNOBS)
def test_each_fork_prefill_balancing_flag_is_named_at_its_line_with_the_measured_rates(knob: str) -> None:
    override = SEED / "compose.fork-prefill-knobs.yaml"

    report = check("compose.yaml", override.name)

    [finding] = [f for f in report.findings if f.rule == "prefill-balancing" and f"`{knob}`" in f.message]
    assert (finding.severity, finding.location.file, finding.location.line) == (
        "warning",
        override,
        line_of(override, f'"{knob}"'),
    )
    assert "46.7" in finding.message
    assert "24.3, 34.7 and 30.7 requests/min" in finding.message


def test_the_fork_knobs_are_the_only_findings_on_the_seeds_engine_with_them() -> None:
    report = check("compose.yaml", "compose.fork-prefill-knobs.yaml")

    knobs = [f.rule for f in report.findings if f.rule != "queue-backstop"]  # the seed's own (see above)
    assert knobs == ["prefill-balancing"] * len(FORK_KNOBS)
    assert report.errors == 0


def test_the_fixture_turns_on_the_setting_the_gateway_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODGATE_ENGINE__USE_PRIORITY", "true")

    assert Settings().engine.use_priority is True


def test_a_gateway_sending_priorities_to_the_seeds_engine_needs_priority_scheduling() -> None:
    override = SEED / "compose.use-priority.yaml"

    report = check("compose.yaml", override.name)

    [finding] = [f for f in report.findings if f.rule != "queue-backstop"]  # the seed's own (see above)
    assert (finding.rule, finding.severity) == ("scheduling-policy", "error")
    assert (finding.location.file, finding.location.line) == (
        SEED / "compose.yaml",
        line_of(SEED / "compose.yaml", '"${MODEL:?'),
    )
    assert [(place.file, place.line) for place in finding.related] == [
        (override, line_of(override, "MODGATE_ENGINE__USE_PRIORITY"))
    ]
