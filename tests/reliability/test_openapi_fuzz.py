"""Schemathesis (``st run --checks all``) against the gateway's own OpenAPI document finds nothing: no 500,
no undocumented status or body, no request valid by the document refused with a 400 or one outside it
accepted, a 405 with its ``Allow`` header. It authenticates as the document says, per security scheme
(``apiKey`` on /v1, ``adminToken`` on /admin, from tests/reliability/schemathesis.toml), against a gateway
with API keys set (every /v1 operation needs one) and remote images on, and against one with neither (the
key optional, data: URLs only). What the
checks accept besides their defaults, and why, is in that file too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
EXAMPLES = 10  # per operation and run: two runs (keys set, none), side by side
SEED = 24  # a fixed seed: the same requests every run (a finding reproduces with `st replay`)


@contextmanager
def gateway_before_sim(keys: bool) -> Iterator[str]:
    """A gateway (admin token set, in-memory state) before the instant simulator: with API keys set and remote
    images on (an image or video URL the document allows off the allowlist is a 403 it lists), or with
    neither (data: URLs only). One budget for both: the two settings share the two runs."""
    auth = {"api_keys": f"{API_KEY}:fuzz-tenant"} if keys else {}
    remote = {"enabled": keys, "allowlist": ["cdn.example.com"] if keys else []}
    with (
        ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)) as sim,
        ThreadedServer(create_app(Settings(engine={"url": sim.url}, remote_images=remote,
                                           auth={"admin_token": ADMIN_TOKEN, **auth}))) as gateway,
    ):
        yield gateway.url


def st_command(cache: Path, *arguments: str) -> tuple[list[str], dict[str, str]]:
    """``st`` with the suite's configuration, its cache in ``cache`` (outside the repository: a run leaves the
    clone as it found it, and starts from no earlier run's crashes) and the credentials its auth sections
    read: the command and its environment."""
    credentials = {"MODGATE_FUZZ_API_KEY": API_KEY, "MODGATE_FUZZ_ADMIN_TOKEN": ADMIN_TOKEN}
    return ([str(SCHEMATHESIS), "--config-file", str(CONFIG), *arguments],
            {**os.environ, "MODGATE_SCHEMATHESIS_CACHE": str(cache), **credentials})


def st(cache: Path, *arguments: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """One ``st`` run to its end (:func:`st_command`)."""
    command, env = st_command(cache, *arguments)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def schemathesis_run(url: str, folder: Path) -> subprocess.Popen[str]:
    """``st run`` with every check against the document ``url`` serves (credentials per scheme from the
    configuration), its cache and HAR log in ``folder``, started (not waited for)."""
    command, env = st_command(
        folder / "cache", "run", f"{url}/schema/openapi.json",
        "--checks", "all", "--seed", str(SEED), "--max-examples", str(EXAMPLES), "--workers", "1",
        "--no-color", "--report", "har", "--report-har-path", str(folder / "run.har"),
    )
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# Both gateways fuzzed at once (one core each): the two runs took their sum in series, about 3 minutes.
@pytest.mark.timeout(900)  # under a minute on an idle machine; several times that on a shared, loaded one
def test_schemathesis_with_every_check_finds_nothing(tmp_path: Path) -> None:
    with gateway_before_sim(keys=True) as keyed, gateway_before_sim(keys=False) as open_:
        gateways = {tmp_path / "keys set": keyed, tmp_path / "no keys": open_}
        runs = {folder: schemathesis_run(url, folder) for folder, url in gateways.items()}
        try:
            printed = {folder: run.communicate(timeout=880)[0] for folder, run in runs.items()}
        finally:
            for run in runs.values():
                run.kill()
        for folder, url in gateways.items():
            assert_found_nothing(url, runs[folder].returncode, printed[folder], folder)


def assert_found_nothing(gateway_url: str, returncode: int, printed: str, folder: Path) -> None:
    """One run's verdict: no failure, every operation tested and past its auth check at least once."""
    assert returncode == 0, printed[-8000:]
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
    admitted = admitted_operations(document, folder / "run.har")
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
        ThreadedServer(create_app(Settings(engine={"url": sim.url},
                                           auth={"admin_token": ADMIN_TOKEN}))) as gateway,
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
