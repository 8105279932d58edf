"""deploy/spark/restart: valid bash, and its order of steps against a fake docker (ShellCheck: see
test_shell_scripts.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

RESTART = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "restart"

# Stands in for the docker client: logs every call, answers probes as FAKE_HEALTHY says.
FAKE_DOCKER = r"""#!/usr/bin/env bash
echo "docker $*" >> "$FAKE_LOG"
[[ "${1:-}" == info ]] && exit "${FAKE_INFO_STATUS:-0}"
[[ "${1:-}" == compose ]] || exit 1
shift
while [[ $# -gt 0 ]]; do
  case "$1" in
    --project-directory | -f | --env-file) shift 2 ;;
    *) break ;;
  esac
done
case "$1" in
  config) exit "${FAKE_CONFIG_STATUS:-0}" ;;
  exec) [[ " ${FAKE_HEALTHY:-} " == *" $3 "* ]] && exit 0 || exit 1 ;;
  ps) echo "${FAKE_STATE:-running}" ;;
  logs) echo "fake log line of ${*: -1}" ;;
esac
exit 0
"""
# Stands in for `modgate`: logs the call and exits FAKE_CHECK_STATUS.
FAKE_MODGATE = """#!/usr/bin/env bash
echo "modgate $*" >> "$FAKE_LOG"
exit "${FAKE_CHECK_STATUS:-0}"
"""


@dataclass
class Spark:
    """A copy of the restart script beside a compose.yaml and .env, with fake docker and modgate on PATH."""

    folder: Path
    log: Path
    env: dict[str, str]

    def run(self, **overrides: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.folder / "restart")],
            env={**self.env, **overrides},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def verbs(self) -> list[str]:
        """The modgate/compose sub-commands called, in order, without global options or probes."""
        verbs = []
        for call in self.calls():
            words = call.split()
            if words[:2] == ["docker", "info"]:
                verbs.append("info")
                continue
            if words[0] == "modgate":
                verbs.append("modgate " + " ".join(words[1:3]))
                continue
            rest = words[2:]
            while rest and rest[0] in ("--project-directory", "-f", "--env-file"):
                rest = rest[2:]
            if rest[0] not in ("exec", "ps"):
                verbs.append(" ".join(rest))
        return verbs


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def spark(tmp_path: Path) -> Spark:
    folder = tmp_path / "spark"
    folder.mkdir()
    shutil.copy(RESTART, folder / "restart")
    (folder / "compose.yaml").write_text("services: {}\n")
    (folder / ".env").write_text("GPU_MEM_UTIL=0.822\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "docker", FAKE_DOCKER)
    _executable(bin_dir / "modgate", FAKE_MODGATE)
    log = tmp_path / "calls.log"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_HEALTHY": "vllm gateway",
        "POLL_INTERVAL_SECONDS": "0",
    }
    return Spark(folder, log, env)


def test_the_restart_script_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n", str(RESTART)], capture_output=True, text=True, check=False)

    assert result.returncode == 0, result.stderr


def test_restart_checks_then_stops_with_timeout_10_and_orphans_then_starts(spark: Spark) -> None:
    result = spark.run()

    assert result.returncode == 0, result.stderr
    assert spark.verbs() == [
        "modgate deploy check",
        "config -q",
        "info",
        "down --timeout 10 --remove-orphans",
        "up -d vllm",
        "up -d",
    ]


def test_restart_never_force_recreates(spark: Spark) -> None:
    spark.run()

    assert spark.calls()
    assert not [call for call in spark.calls() if "--force-recreate" in call]


def test_restart_waits_for_engine_health_then_gateway_readiness(spark: Spark) -> None:
    spark.run()

    probes = [call for call in spark.calls() if " exec " in call]
    assert "vllm" in probes[0]
    assert "http://127.0.0.1:8000/health" in probes[0]
    assert "gateway" in probes[-1]
    assert "http://127.0.0.1:8080/readyz" in probes[-1]


def test_restart_refuses_to_stop_anything_when_deploy_check_finds_errors(spark: Spark) -> None:
    result = spark.run(FAKE_CHECK_STATUS="1")

    assert result.returncode != 0
    assert "refusing to restart" in result.stderr
    assert spark.verbs() == ["modgate deploy check"]


def test_restart_refuses_to_stop_anything_when_compose_config_fails(spark: Spark) -> None:
    result = spark.run(FAKE_CONFIG_STATUS="15")

    assert result.returncode != 0
    assert "config -q failed" in result.stderr
    assert "down --timeout 10 --remove-orphans" not in spark.verbs()


def test_restart_refuses_to_stop_anything_when_the_docker_engine_does_not_answer(spark: Spark) -> None:
    result = spark.run(FAKE_INFO_STATUS="1")

    assert result.returncode != 0
    assert "nothing was stopped" in result.stderr
    assert "down --timeout 10 --remove-orphans" not in spark.verbs()


def test_restart_refuses_when_modgate_is_not_installed(spark: Spark) -> None:
    result = spark.run(MODGATE="modgate-not-installed")

    assert result.returncode != 0
    assert "'modgate-not-installed' not found" in result.stderr
    assert spark.calls() == []


def test_restart_refuses_without_an_env_file(spark: Spark) -> None:
    (spark.folder / ".env").unlink()

    result = spark.run()

    assert result.returncode != 0
    assert ".env.example" in result.stderr
    assert spark.calls() == []


def test_an_engine_that_never_answers_health_fails_with_its_last_log_lines(spark: Spark) -> None:
    result = spark.run(FAKE_HEALTHY="gateway", ENGINE_WAIT_SECONDS="0")

    assert result.returncode == 1
    assert "vllm: no answer from http://127.0.0.1:8000/health within 0s" in result.stderr
    assert "fake log line of vllm" in result.stderr
    assert "up -d" not in spark.verbs()  # the gateway is never started


def test_a_gateway_that_never_answers_readyz_fails_with_its_last_log_lines(spark: Spark) -> None:
    result = spark.run(FAKE_HEALTHY="vllm", GATEWAY_WAIT_SECONDS="0")

    assert result.returncode == 1
    assert "gateway: no answer from http://127.0.0.1:8080/readyz within 0s" in result.stderr
    assert "fake log line of gateway" in result.stderr


def test_an_engine_container_that_exited_fails_before_the_wait_runs_out(spark: Spark) -> None:
    # A bounded wait of 600 s: only the exited-container check can end this run within the 60 s timeout.
    result = spark.run(FAKE_HEALTHY="", FAKE_STATE="exited (1)", ENGINE_WAIT_SECONDS="600")

    assert result.returncode == 1
    assert "the container stopped (exited (1))" in result.stderr
    assert "fake log line of vllm" in result.stderr


def test_a_wait_limit_that_is_not_a_whole_number_is_refused_before_anything_runs(spark: Spark) -> None:
    result = spark.run(ENGINE_WAIT_SECONDS="10m")

    assert result.returncode != 0
    assert spark.calls() == []
