"""The schedule examples in deploy/schedule/ run commands the CLI actually accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml
from typer.testing import CliRunner

from cli.quality import quality_app

SCHEDULE = Path(__file__).resolve().parents[2] / "deploy" / "schedule"
runner = CliRunner()


def run_here(args: list[str], tmp_path: Path) -> str:
    """Run `modgate quality …` args with the deployment's paths swapped for temporary ones."""
    assert args[:2] == ["modgate", "quality"]
    local = [
        str(tmp_path / "out") if arg.startswith(("/reports", "/var/lib/modgate/quality-reports")) else arg
        for arg in args[2:]
    ]
    result = runner.invoke(
        quality_app, [*local, "--records", str(tmp_path / "records"), "--bootstrap", "200"]
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_the_kubernetes_cronjob_runs_the_weekly_report(tmp_path: Path) -> None:
    job = yaml.safe_load((SCHEDULE / "quality-report-cronjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "CronJob")
    assert job["spec"]["schedule"] == "15 6 * * 1"
    assert job["spec"]["timeZone"] == "Etc/UTC"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    container = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"] for item in container["env"]}
    assert {"MODGATE_REDIS__URL", "MPLCONFIGDIR"} <= env
    output = run_here([*container["command"], *container["args"]], tmp_path)
    assert "No quality records for" in output
    assert len(list((tmp_path / "out").glob("quality-*.html"))) == 1


def test_the_cron_example_runs_the_weekly_report(tmp_path: Path) -> None:
    lines = [
        line
        for line in (SCHEDULE / "crontab.example").read_text().splitlines()
        if line.strip() and not line.startswith("#") and "=" not in line.split()[0]
    ]
    report_line = next(line for line in lines if " quality report " in line)
    fields = shlex.split(report_line.split(">>")[0])
    assert fields[:5] == ["15", "6", "*", "*", "1"]
    assert "%" not in report_line  # cron turns % into newlines
    command = [Path(fields[5]).name, *fields[6:]]
    output = run_here(command, tmp_path)
    assert "No quality records for" in output
