"""Schemathesis (``st run --checks all``) against the gateway's own OpenAPI document finds nothing: no 500,
no undocumented status or body, no request valid by the document refused with a 400 or one outside it
accepted, a 405 with its ``Allow`` header. It authenticates as the document says, per security scheme
(``apiKey`` on /v1, ``adminToken`` on /admin, from tests/reliability/schemathesis.toml), against a gateway
with API keys set (every /v1 operation needs one) and against one without (the key optional). What the
checks accept besides their defaults, and why, is in that file too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.simulator import PRESETS, create_sim_app
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.support import ADMIN_TOKEN

API_KEY = "fuzz-key-0123456789"

CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("st")
EXAMPLES = 10  # per operation and run: two runs (keys set, none) at the cost the one run of 20 had
SEED = 24  # a fixed seed: the same requests every run (a finding reproduces with `st replay`)


@pytest.fixture(scope="module", params=["keys set", "no keys"])
def gateway_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A gateway (admin token set, in-memory state; API keys set, or none) before the instant simulator."""
    keys = {"api_keys": f"{API_KEY}:fuzz-tenant"} if request.param == "keys set" else {}
    with (
        ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)) as sim,
        ThreadedServer(create_app(Settings(engine_url=sim.url, admin_token=ADMIN_TOKEN, **keys))) as gateway,
    ):
        yield gateway.url


def st(cache: Path, *arguments: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``st`` with the suite's configuration, its cache in ``cache`` (outside the repository: a run leaves the
    clone as it found it, and starts from no earlier run's crashes) and the credentials its auth sections
    read."""
    credentials = {"MODGATE_FUZZ_API_KEY": API_KEY, "MODGATE_FUZZ_ADMIN_TOKEN": ADMIN_TOKEN}
    return subprocess.run(
        [str(SCHEMATHESIS), "--config-file", str(CONFIG), *arguments],
        env={**os.environ, "MODGATE_SCHEMATHESIS_CACHE": str(cache), **credentials},
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def schemathesis_run(url: str, cache: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``st run`` with every check against the document ``url`` serves (credentials per scheme from the
    configuration)."""
    return st(
        cache, "run", f"{url}/schema/openapi.json",
        "--checks", "all", "--seed", str(SEED), "--max-examples", str(EXAMPLES), "--workers", "1",
        "--no-color", *options,
        timeout=900,
    )


@pytest.mark.timeout(900)  # under a minute on an idle machine; several times that on a shared, loaded one
def test_schemathesis_with_every_check_finds_nothing(gateway_url: str, tmp_path: Path) -> None:
    run = schemathesis_run(gateway_url, tmp_path / "cache", "--report", "har",
                           "--report-har-path", str(tmp_path / "run.har"))
    printed = run.stdout + run.stderr
    assert run.returncode == 0, printed[-8000:]
    tested = re.search(r"Tested: (\d+)", printed)
    selected = re.search(r"Selected: (\d+)/(\d+)", printed)
    assert tested, printed[-3000:]
    assert selected, printed[-3000:]
    assert int(tested[1]) == int(selected[2]) >= 13  # every operation of the document, none skipped
    generated = re.search(r"(\d+) generated", printed)
    assert generated, printed[-3000:]
    assert int(generated[1]) > 13 * EXAMPLES
    # Exercised, not only knocked at: each operation answered at least one request past its auth check (a
    # credential the document's scheme does not carry as the server reads it would get nothing but 401).
    document = httpx.get(f"{gateway_url}/schema/openapi.json", timeout=30).json()
    admitted = admitted_operations(document, tmp_path / "run.har")
    every = {(method.upper(), path) for path, item in document["paths"].items() for method in item
             if method in {"get", "put", "post", "delete", "patch"}}
    assert every - admitted == set()


def admitted_operations(document: dict[str, Any], har: Path) -> set[tuple[str, str]]:
    """The document's operations (method, path template) with a response other than 401 in the HAR log."""
    templates = [(path, re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(path)) + "$"))
                 for path in document["paths"]]
    admitted: set[tuple[str, str]] = set()
    for entry in json.loads(har.read_text())["log"]["entries"]:
        if entry["response"]["status"] == 401:
            continue
        path = httpx.URL(entry["request"]["url"]).path
        for template, pattern in templates:
            if pattern.match(path):
                admitted.add((entry["request"]["method"], template))
    return admitted


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
            timeout=600,
        )
    assert run.returncode != 0, run.stdout[-3000:]
    assert "Schema-valid request rejected" in run.stdout, run.stdout[-3000:]
    # The finding is recorded in the temporary cache, not in the repository
    assert list(cache.glob("crashes/*.json")), sorted(str(p) for p in cache.rglob("*"))
