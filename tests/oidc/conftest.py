"""A real OpenID Connect provider for the session: ``oidc-provider`` on Node (tests/oidc/provider.mjs)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.servers import free_port
from cli.embedded import ThreadedServer
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.oidc.support import CONSOLE_CLIENT, HERE, KEYS, SCOPES, OidcProvider
from tests.processes import poll
from tests.support import ADMIN_TOKEN, GatewayFactory


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """``node tests/oidc/provider.mjs PORT``, started once per session and stopped after it. Fails, never
    skips, without Node or the installed package (scripts/test runs ``npm ci`` in tests/oidc)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("these tests need Node.js (apt-get install nodejs npm)")
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        pytest.fail("oidc-provider is not installed: run `npm ci` in tests/oidc (scripts/test does)")
    port = free_port()
    log_path = tmp_path_factory.mktemp("oidc") / "provider.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([node, "provider.mjs", str(port)], cwd=HERE, stdout=log, stderr=log)
    provider = OidcProvider(f"http://127.0.0.1:{port}", process, log_path)

    def serving() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the OpenID provider exited with {process.returncode}:\n{provider.log()}")
        try:
            discovery = httpx.get(f"{provider.issuer}/.well-known/openid-configuration", timeout=1)
            return discovery.status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll(serving, 30, "the OpenID provider's discovery document", every_s=0.05)
        yield provider
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def oidc_gateway(oidc_provider: OidcProvider, sim: ThreadedServer) -> Iterator[GatewayFactory]:
    """``oidc_gateway(**settings)``: a gateway whose console signs people in through the provider (with the
    confidential client), in front of the instant simulator, with one API key per tenant."""
    servers: list[ThreadedServer] = []

    def start(**overrides: Any) -> ThreadedServer:
        port = free_port()
        client_id, secret = CONSOLE_CLIENT
        oidc = {"issuer": oidc_provider.issuer, "client_id": client_id, "client_secret": secret,
                "redirect_base_url": f"http://127.0.0.1:{port}", "scopes": SCOPES,
                "provider_name": "Test IdP", **overrides.pop("oidc", {})}
        settings = Settings(
            admin_token=ADMIN_TOKEN, engine_url=sim.url, oidc=oidc,
            api_keys=",".join(f"{key}:{tenant}" for tenant, key in KEYS.items()),
            console={"cookie_secure": False, **overrides.pop("console", {})}, **overrides,
        )
        server = ThreadedServer(create_app(settings), port=port).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
