"""One naming scheme for settings (issue 41): every setting is MODGATE_<GROUP>__<NAME>, and each old flat name
still reads into the same setting, with one deprecation warning naming its replacement."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from bench.servers import free_port, wait_until_ready
from cli.main import app as cli
from deploy.check.model import gateway_setting
from gateway.renamed_settings import RENAMED, deprecated_env_names
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

# A value for each moved setting that is not its default, so reading it shows it was read. Settings that need
# another one to be valid name it too, under its new name.
SAMPLES: dict[str, tuple[str, dict[str, str]]] = {
    "host": ("10.0.0.5", {}),
    "port": ("9191", {}),
    "keep_alive_s": ("30", {}),
    "log_level": ("debug", {}),
    "drain_s": ("2.5", {}),
    "model_name": ("house-moderation", {}),
    "engine_url": ("http://engine-a:8000", {}),
    "engine_caps": ("http://engine-a:8000=3", {"MODGATE_ENGINE__URL": "http://engine-a:8000"}),
    "max_inflight": ("5", {}),
    "redis_url": ("redis://cache.internal:6379/2", {}),
    "api_keys": ("k-one:tenant-a", {}),
    "api_keys_from_redis": ("true", {"MODGATE_REDIS__URL": "redis://cache.internal:6379/2"}),
    "admin_token": ("an-admin-token-of-32-characters!", {}),
}


@pytest.fixture(autouse=True)
def _no_moved_setting_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the names of the moved settings it reads; none leaks in from the machine."""
    for old, new in deprecated_env_names().items():
        monkeypatch.delenv(old, raising=False)
        monkeypatch.delenv(new, raising=False)


def _read(monkeypatch: pytest.MonkeyPatch, environment: dict[str, str]) -> Settings:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_every_setting_belongs_to_a_group() -> None:
    flat = [name for name, field in Settings.model_fields.items()
            if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel))]
    assert flat == [], f"flat settings {flat}: put each in a group (MODGATE_<GROUP>__<NAME>)"


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_name_reads_into_the_same_setting_with_one_warning(
    old: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    value, needs = SAMPLES[old]
    old_name, new_name = f"MODGATE_{old.upper()}", deprecated_env_names()[f"MODGATE_{old.upper()}"]
    default = getattr(_read(monkeypatch, needs), old)
    by_new = getattr(_read(monkeypatch, {new_name: value}), old)
    monkeypatch.delenv(new_name)
    caplog.set_level(logging.WARNING, logger="gateway.renamed_settings")
    with pytest.warns(DeprecationWarning, match=f"{old_name} is deprecated") as caught:
        by_old = _read(monkeypatch, {old_name: value})
    assert getattr(by_old, old) == by_new != default
    group, field = RENAMED[old]
    assert getattr(getattr(by_old, group), field) == by_new
    said = [str(warning.message) for warning in caught]
    assert said == [f"{old_name} is deprecated: use {new_name} (docs/settings.md)"]
    assert [record.getMessage() for record in caplog.records] == said


@pytest.mark.parametrize("old", ["engine_url", "max_inflight", "admin_token"])
def test_the_new_name_wins_over_the_old(old: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value, _ = SAMPLES[old]
    old_name = f"MODGATE_{old.upper()}"
    new_name = deprecated_env_names()[old_name]
    newer = {"engine_url": "http://engine-b:8000", "max_inflight": "7",
             "admin_token": "another-admin-token-32-characters"}[old]
    with pytest.warns(DeprecationWarning, match=f"{new_name} is set too and wins"):
        settings = _read(monkeypatch, {old_name: value, new_name: newer})
    assert str(getattr(settings, old)) == newer


def test_old_names_are_read_whatever_their_case(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(DeprecationWarning, match="MODGATE_ENGINE_URL is deprecated"):
        settings = _read(monkeypatch, {"modgate_engine_url": "http://engine-a:8000"})
    assert settings.engine.url == "http://engine-a:8000"


def test_old_keywords_and_attributes_keep_working_in_python_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = Settings(engine_url="http://engine-a:8000/", max_inflight=3, admin_token="x" * 16,
                            port=0)
        copied = settings.model_copy(update={"engine_url": "http://engine-b:8000", "host": "10.0.0.5"})
    read = (settings.engine.url, settings.engine.max_inflight, settings.auth.admin_token, settings.port)
    assert read == ("http://engine-a:8000", 3, "x" * 16, 0)
    read = (copied.engine_url, copied.engine.max_inflight, copied.server.host, copied.server.port)
    assert read == ("http://engine-b:8000", 3, "10.0.0.5", 0)
    assert settings.engine_url == "http://engine-a:8000"  # the group's copy was replaced, not changed


def test_a_setting_in_error_is_named_by_its_new_name(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="MODGATE_ENGINE__URL must start with http"):
        _read(monkeypatch, {"MODGATE_ENGINE__URL": "engine-a:8000"})


def test_deploy_check_reads_a_gateway_setting_under_either_name() -> None:
    assert gateway_setting({"MODGATE_MAX_INFLIGHT": "4"}, "MODGATE_ENGINE__MAX_INFLIGHT") == "4"
    both = {"MODGATE_MAX_INFLIGHT": "4", "MODGATE_ENGINE__MAX_INFLIGHT": "6"}
    assert gateway_setting(both, "MODGATE_ENGINE__MAX_INFLIGHT") == "6"
    assert gateway_setting({}, "MODGATE_ENGINE__MAX_INFLIGHT") is None


def test_a_command_reads_its_option_from_the_old_name_with_a_warning(redis_url: str) -> None:
    old = {"MODGATE_REDIS_URL": redis_url}
    with pytest.warns(DeprecationWarning, match="MODGATE_REDIS_URL is deprecated: use MODGATE_REDIS__URL"):
        added = CliRunner().invoke(cli, ["keys", "add", "--tenant", "acme"], env=old)
    assert added.exit_code == 0, added.output
    listed = CliRunner().invoke(cli, ["keys", "list"], env={"MODGATE_REDIS__URL": redis_url})
    assert listed.exit_code == 0, listed.output
    assert "acme" in listed.stdout


def test_modgate_serve_still_starts_on_old_names(tmp_path: Path) -> None:
    """A deployment not yet moved to the new names keeps running, and its log says what to rename."""
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MODGATE_ENGINE__STARTUP_CHECK": "false",
           "MODGATE_PORT": str(port), "MODGATE_LOG_LEVEL": "warning", "MODGATE_DRAIN_S": "0"}
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "cli.main", "serve"], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/readyz", process, timeout_s=180)
    finally:
        process.terminate()
        process.wait(30)
    output = log_path.read_text()
    for old in ("MODGATE_PORT", "MODGATE_LOG_LEVEL", "MODGATE_DRAIN_S"):
        new = deprecated_env_names()[old]
        assert output.count(f"{old} is deprecated: use {new}") == 1, output


# Where a deprecated name may still appear: the table that maps it, its generated page, and this test.
MAY_NAME_OLD = {"gateway/renamed_settings.py", "docs/settings.md", "tests/gateway/test_settings_names.py"}
SCANNED = ("README.md", "Makefile", "docs", "deploy", "scripts", "bench", "tests", "gateway", "quality",
           "shaping")
BINARY = {".png", ".jpg", ".jpeg", ".parquet", ".pyc", ".gguf"}


def _text_files() -> list[Path]:
    found: list[Path] = []
    for entry in SCANNED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found += [p for p in candidates if "__pycache__" not in p.parts and p.suffix not in BINARY]
    return found


def test_no_doc_deploy_file_or_script_sets_a_deprecated_name() -> None:
    old = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(deprecated_env_names(), key=len, reverse=True))
                     + r")(?![A-Za-z0-9_])")
    files = _text_files()
    assert any(path.name == "compose.yaml" for path in files)
    found = [f"{path.relative_to(ROOT)}:{number}: {match.group(1)}"
             for path in files if str(path.relative_to(ROOT)) not in MAY_NAME_OLD
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             for match in old.finditer(line)]
    assert found == [], "deprecated names (docs/settings.md has their replacements):\n" + "\n".join(found)
