"""Every shell script in the repository, found by its shebang, passes the real ShellCheck."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The shells ShellCheck knows: sh, bash, dash, ksh (directly or through env, with or without flags).
SHELL_SHEBANG = re.compile(rb"#!\s*\S*/(?:env\s+(?:-\S+\s+)*)?(?:sh|bash|dash|ksh)(?:\s|$)")


def repository_files() -> list[Path]:
    """Files git tracks or would track (untracked but not ignored): never the virtualenv or caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({ROOT / name.decode() for name in listed.split(b"\0") if name})


def is_shell_script(path: Path) -> bool:
    if not path.is_file():
        return False  # listed by git but deleted in the work tree
    with path.open("rb") as file:
        return SHELL_SHEBANG.match(file.readline()) is not None


def shell_scripts() -> list[Path]:
    return [path for path in repository_files() if is_shell_script(path)]


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_scripts_are_found_by_shebang_wherever_they_live() -> None:
    found = {relative(path) for path in shell_scripts()}

    assert found >= {"scripts/test", ".ci/run", "deploy/spark/restart"}
    assert not any(name.endswith(".py") for name in found)


@pytest.mark.parametrize(
    ("first_line", "shell"),
    [
        (b"#!/bin/sh\n", True),
        (b"#!/usr/bin/env bash\n", True),
        (b"#! /bin/bash -eu\n", True),
        (b"#!/usr/bin/env -S bash -e\n", True),
        (b"#!/usr/bin/env python3\n", False),
        (b"#!/usr/bin/env bashful\n", False),
        (b"# not a shebang: /bin/sh\n", False),
    ],
)
def test_a_shell_shebang_is_told_from_other_first_lines(
    tmp_path: Path, first_line: bytes, shell: bool
) -> None:
    script = tmp_path / "script"
    script.write_bytes(first_line + b"echo hi\n")

    assert is_shell_script(script) is shell


@pytest.mark.parametrize("script", shell_scripts(), ids=relative)
def test_every_shell_script_passes_shellcheck(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is missing: scripts/test installs it (apt-get install -y shellcheck)")
    result = subprocess.run(
        [shellcheck, "--format=gcc", relative(script)], cwd=ROOT, capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, f"ShellCheck findings:\n{result.stdout}{result.stderr}"


def test_shellcheck_reads_a_comment_that_starts_with_its_name_as_a_broken_directive(tmp_path: Path) -> None:
    """What scripts/test line 28 once had: the check above must see it."""
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is missing: scripts/test installs it (apt-get install -y shellcheck)")
    script = tmp_path / "script"
    script.write_text("#!/usr/bin/env bash\n# shellcheck for the deploy scripts' tests.\necho hi\n")

    result = subprocess.run(
        [shellcheck, "--format=gcc", str(script)], capture_output=True, text=True, check=False
    )

    assert result.returncode != 0
    assert "SC1073" in result.stdout
