"""`modgate deploy check` on the command line: output formats, exit statuses, `docker compose config`."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli.main import app as modgate_app
from deploy.cli import deploy_app

SPARK_DIR = Path(__file__).resolve().parents[2] / "deploy" / "spark"

BAD_COMPOSE = """\
services:
  vllm:
    image: vllm/vllm-openai:v0.32.0
    command:
      - "some/model"
      - "--max-num-seqs"
      - 8
      - "--enable-prompt-tokens-details"
      - "--scheduling-policy"
      - "priority"
"""
WARNING_ONLY_COMPOSE = BAD_COMPOSE.replace("      - 8\n", '      - "8"\n') + (
    '      - "--long-prefill-token-threshold"\n      - "512"\n'
)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(deploy_app, ["check", *args], env=env)


@pytest.fixture
def bad_folder(tmp_path: Path) -> Path:
    (tmp_path / "compose.yaml").write_text(BAD_COMPOSE)
    (tmp_path / ".env").write_text("")
    return tmp_path


def fake_docker(folder: Path, compose_works: bool, config_status: int = 0) -> Path:
    """A `docker` client stand-in (builtins only: PATH holds nothing else) that logs its arguments."""
    folder.mkdir()
    script = folder / "docker"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{folder}/calls"\n'
        'case "$*" in\n'
        f"  'compose version') exit {0 if compose_works else 1} ;;\n"
        f"  *' config -q') echo 'services.vllm.command.2 must be a string' >&2; exit {config_status} ;;\n"
        "esac\n"
        "exit 0\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def test_errors_print_file_line_severity_rule_and_exit_1(bad_folder: Path) -> None:
    result = invoke(str(bad_folder / "compose.yaml"), "--skip-compose-config")

    assert result.exit_code == 1
    assert f"{bad_folder / 'compose.yaml'}:7  error  unquoted-number  " in result.stdout
    assert "1 error, 0 warnings" in result.stdout


def test_deploy_check_is_a_subcommand_of_the_modgate_command(bad_folder: Path) -> None:
    result = CliRunner().invoke(modgate_app, ["deploy", "check", str(bad_folder), "--skip-compose-config"])

    assert result.exit_code == 1
    assert "unquoted-number" in result.stdout


def test_warnings_alone_exit_0(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(WARNING_ONLY_COMPOSE)
    (tmp_path / ".env").write_text("")

    result = invoke(str(tmp_path), "--skip-compose-config")

    assert result.exit_code == 0
    assert "warning  prefill-scheduling" in result.stdout


def test_the_shipped_spark_folder_checks_clean_against_its_env_example() -> None:
    result = invoke(str(SPARK_DIR), "--env-file", str(SPARK_DIR / ".env.example"), "--skip-compose-config")

    assert result.exit_code == 0
    assert "0 errors, 0 warnings" in result.stdout


def test_json_format_lists_findings_with_file_line_severity_and_rule(bad_folder: Path) -> None:
    result = invoke(str(bad_folder), "--format", "json", "--skip-compose-config")

    document = json.loads(result.stdout)
    assert result.exit_code == 1
    assert document["errors"] == 1
    assert [(f["file"], f["line"], f["severity"], f["rule"]) for f in document["findings"]] == [
        (str(bad_folder / "compose.yaml"), 7, "error", "unquoted-number")
    ]


def test_a_missing_path_exits_2(tmp_path: Path) -> None:
    result = invoke(str(tmp_path / "nowhere.yaml"))

    assert result.exit_code == 2
    assert "no such file" in result.stderr


def test_a_folder_without_a_compose_file_exits_2(tmp_path: Path) -> None:
    assert invoke(str(tmp_path)).exit_code == 2


def test_invalid_yaml_exits_2_with_a_json_error_in_json_format(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("services: [\n")

    result = invoke(str(tmp_path), "--format", "json")

    assert result.exit_code == 2
    assert "not valid YAML" in json.loads(result.stdout)["error"]


def test_a_missing_env_file_given_explicitly_exits_2(bad_folder: Path) -> None:
    assert invoke(str(bad_folder), "--env-file", str(bad_folder / "missing.env")).exit_code == 2


def test_compose_config_is_skipped_when_there_is_no_docker_client(bad_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "empty-bin").mkdir()

    result = invoke(str(bad_folder), env={"PATH": str(tmp_path / "empty-bin")})

    assert "docker compose config: skipped: docker compose not usable" in result.stdout
    assert result.exit_code == 1  # the fixture's own error, not the skip


def test_compose_config_is_skipped_when_the_client_has_no_compose(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(WARNING_ONLY_COMPOSE)
    bin_dir = fake_docker(tmp_path / "bin", compose_works=False)

    result = invoke(str(tmp_path / "compose.yaml"), env={"PATH": str(bin_dir)})

    assert result.exit_code == 0
    assert "docker compose config: skipped: docker compose not usable" in result.stdout


def test_compose_config_runs_with_every_compose_file_and_the_env_file(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(WARNING_ONLY_COMPOSE)
    (tmp_path / "override.yaml").write_text("services: {}\n")
    (tmp_path / "spark.env").write_text("")
    bin_dir = fake_docker(tmp_path / "bin", compose_works=True)

    result = invoke(
        str(tmp_path / "compose.yaml"),
        str(tmp_path / "override.yaml"),
        "--env-file",
        str(tmp_path / "spark.env"),
        env={"PATH": str(bin_dir)},
    )

    assert result.exit_code == 0
    assert "docker compose config: passed" in result.stdout
    assert (bin_dir / "calls").read_text().splitlines()[-1] == (
        f"compose --project-directory {tmp_path} -f {tmp_path / 'compose.yaml'} "
        f"-f {tmp_path / 'override.yaml'} --env-file {tmp_path / 'spark.env'} config -q"
    )


def test_a_failing_compose_config_is_an_error_with_composes_message(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(WARNING_ONLY_COMPOSE)
    bin_dir = fake_docker(tmp_path / "bin", compose_works=True, config_status=15)

    result = invoke(str(tmp_path / "compose.yaml"), env={"PATH": str(bin_dir)})

    assert result.exit_code == 1
    assert "error  compose-config  docker compose config -q: services.vllm.command.2 must be a string" in (
        result.stdout
    )
