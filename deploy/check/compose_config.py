"""The `compose-config` rule: `docker compose config -q`, run where the compose client works."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from deploy.check.model import Finding, Location

_NOT_USABLE = "skipped: docker compose not usable"


def run_compose_config(compose_files: Sequence[Path], env_file: Path | None) -> tuple[str, list[Finding]]:
    """`docker compose config -q` when the compose client works (it needs no engine), else a skip note."""
    docker = shutil.which("docker")
    if docker is None:
        return f"{_NOT_USABLE} (no docker client)", []
    try:
        version = subprocess.run(  # noqa: S603 - a fixed argument list, no shell
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return _NOT_USABLE, []
    if version.returncode != 0:
        return _NOT_USABLE, []
    command = [docker, "compose", "--project-directory", str(compose_files[0].parent)]
    for path in compose_files:
        command += ["-f", str(path)]
    if env_file is not None:
        command += ["--env-file", str(env_file)]
    try:
        result = subprocess.run(  # noqa: S603 - a fixed argument list, no shell
            [*command, "config", "-q"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{_NOT_USABLE} ({exc})", []
    if result.returncode == 0:
        return "passed", []
    message = " ".join((result.stderr or result.stdout).split()) or f"exit status {result.returncode}"
    return "failed", [
        Finding("error", "compose-config", f"docker compose config -q: {message}", Location(compose_files[0]))
    ]
