"""Schemathesis (``st run --checks all``) against the gateway's own OpenAPI document finds nothing: no 500,
no undocumented status or body, no request valid by the document refused with a 400 or one outside it
accepted, a 405 with its ``Allow`` header. What the checks accept besides their defaults, and why, is in
tests/reliability/schemathesis.toml."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.simulator import PRESETS, create_sim_app
from gateway.cli.embedded import ThreadedServer
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.support import ADMIN_TOKEN

CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("st")
SEED = 24  # a fixed seed: the same requests every run (a finding reproduces with `st replay`)


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    """A gateway (admin token set, in-memory state) in front of the instant simulator."""
    with (
        ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)) as sim,
        ThreadedServer(create_app(Settings(engine_url=sim.url, admin_token=ADMIN_TOKEN))) as gateway,
    ):
        yield gateway.url


def st(cache: Path, *arguments: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``st`` with the suite's configuration, its cache in ``cache`` (outside the repository: a run leaves the
    clone as it found it, and starts from no earlier run's crashes)."""
    return subprocess.run(
        [str(SCHEMATHESIS), "--config-file", str(CONFIG), *arguments],
        env={**os.environ, "MODGATE_SCHEMATHESIS_CACHE": str(cache)},
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def schemathesis_run(url: str, cache: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``st run`` with every check against the document ``url`` serves, admin token sent."""
    return st(
        cache, "run", f"{url}/schema/openapi.json",
        "--checks", "all", "--seed", str(SEED), "--max-examples", "20", "--workers", "1",
        "--header", f"Authorization: Bearer {ADMIN_TOKEN}", "--no-color", *options,
        timeout=900,
    )


@pytest.mark.timeout(900)  # about a minute on an idle machine; several times that on a shared, loaded one
def test_schemathesis_with_every_check_finds_nothing(gateway_url: str, tmp_path: Path) -> None:
    run = schemathesis_run(gateway_url, tmp_path / "cache")
    printed = run.stdout + run.stderr
    assert run.returncode == 0, printed[-8000:]
    tested = re.search(r"Tested: (\d+)", printed)
    selected = re.search(r"Selected: (\d+)/(\d+)", printed)
    assert tested, printed[-3000:]
    assert selected, printed[-3000:]
    assert int(tested[1]) == int(selected[2]) >= 13  # every operation of the document, none skipped
    generated = re.search(r"(\d+) generated", printed)
    assert generated, printed[-3000:]
    assert int(generated[1]) > 13 * 20


def test_schemathesis_finds_a_document_that_promises_too_much(tmp_path: Path) -> None:
    # The same run on a document without the image pattern: schemathesis sends a schema-valid "url" the
    # server refuses with a 400, and says so (the check above can fail).
    with (
        ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)) as sim,
        ThreadedServer(create_app(Settings(engine_url=sim.url, admin_token=ADMIN_TOKEN))) as gateway,
    ):
        document = httpx.get(f"{gateway.url}/schema/openapi.json", timeout=30).json()
        del document["components"]["schemas"]["ImageURL"]["properties"]["url"]["pattern"]
        loose = tmp_path / "openapi.json"
        loose.write_text(json.dumps(document))
        cache = tmp_path / "cache"
        run = st(
            cache, "run", str(loose), "--url", gateway.url,
            "--checks", "positive_data_acceptance", "--seed", str(SEED), "--max-examples", "10",
            "--include-path", "/v1/videos/{video_id}/keyframes", "--workers", "1", "--no-color",
            "--header", f"Authorization: Bearer {ADMIN_TOKEN}",
            timeout=600,
        )
    assert run.returncode != 0, run.stdout[-3000:]
    assert "Schema-valid request rejected" in run.stdout, run.stdout[-3000:]
    # The finding is recorded in the temporary cache, not in the repository
    assert list(cache.glob("crashes/*.json")), sorted(str(p) for p in cache.rglob("*"))
