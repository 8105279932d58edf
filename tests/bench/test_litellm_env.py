"""LiteLLM's environment is installed by one process at a time: the suite's background install
(scripts/test) and the overhead test that needs it meet at its file lock, and the second finds it ready."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from bench import litellm_env
from deploy.engine_launch import exclusive_lock


def test_a_caller_waits_for_the_install_under_way_and_then_finds_it_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODGATE_BENCH_HOME", str(tmp_path))
    root = litellm_env.venv_dir()
    found: list[Path] = []
    caller = threading.Thread(target=lambda: found.append(litellm_env.ensure_litellm()))
    with exclusive_lock(root.with_name("litellm-venv.lock")):  # the background install, under way
        caller.start()
        time.sleep(0.3)
        assert not found, "the caller went on while the install held the lock"
        (root / "bin").mkdir(parents=True)  # what the install leaves when it is done
        (root / "bin" / "litellm").write_text("")
        (root / "modgate-litellm-version").write_text(litellm_env.LITELLM_VERSION)
    caller.join(timeout=10)
    assert found == [root / "bin" / "litellm"]  # ready: not installed a second time
