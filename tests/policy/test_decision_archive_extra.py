"""The decision archive is the ``archive`` extra (pyarrow): the runtime serves, logs and exports without."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from contracts.decisions import archive_missing, write_day_partitions

ROOT = Path(__file__).resolve().parents[2]


def test_an_install_without_pyarrow_says_which_extra_writes_the_archive(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # what `import pyarrow` meets where it is not installed
    assert archive_missing() == (
        "the decision archive's Parquet files need pyarrow: pip install 'modgate[archive]'")
    with pytest.raises(ImportError, match=r"modgate\[archive\]"):
        write_day_partitions([], tmp_path)


def test_an_export_over_archived_days_without_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    (tmp_path / "day=2026-12-03").mkdir()  # a day another install archived
    (tmp_path / "day=2026-12-03" / "part-20261203T000000-0a1b2c3d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    result = CliRunner().invoke(app, ["decisions", "export", "--since", "2026-12-01",
                                      "--archive-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "modgate[archive]" in result.output


def test_an_install_with_pyarrow_writes_the_archive() -> None:
    assert archive_missing() is None


def test_the_gateway_serves_and_exports_without_pyarrow_or_opencv(tmp_path: Path) -> None:
    """The runtime's modules import, and the app starts and answers, with the extras' packages blocked."""
    script = f"""
import sys
sys.modules["pyarrow"] = None
sys.modules["cv2"] = None
import asyncio, httpx
from datetime import datetime
from deploy.keyframes import make_keyframe
from tests.support import image_input
from cli.embedded import ThreadedServer
from cli.main import engine_settings
from gateway.http.app import create_app
from gateway.settings import Settings
from gateway.decisions.log import export_rows

settings = Settings(decisions={{"archive_dir": {str(tmp_path / "archive")!r}}})
with engine_settings(settings) as served, ThreadedServer(create_app(served)) as server:
    frame = make_keyframe("allow", 320, 180, seed=1)
    answer = httpx.post(f"{{server.url}}/v1/moderations", json={{"input": image_input(frame)}}, timeout=30)
    assert answer.status_code == 200, answer.text
since = datetime.fromisoformat("2026-01-01T00:00Z")
print(asyncio.run(export_rows(None, settings.decisions.archive_dir, since)))
print("pyarrow" in sys.modules and sys.modules["pyarrow"] is not None)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["[]", "False"]
    assert "decisions are not moved to Parquet files" in done.stderr
