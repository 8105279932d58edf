"""Schemathesis against the gateway's own OpenAPI document: whatever it sends, never a 500."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from deploy.simulator import PRESETS, create_sim_app
from gateway.cli.embedded import ThreadedServer
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.support import ADMIN_TOKEN


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    """A gateway (admin token set, in-memory state) in front of the instant simulator."""
    with (
        ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)) as sim,
        ThreadedServer(create_app(Settings(engine_url=sim.url, admin_token=ADMIN_TOKEN))) as gateway,
    ):
        yield gateway.url


@pytest.fixture(scope="module")
def gateway_schema(gateway_url: str) -> schemathesis.BaseSchema:
    """The OpenAPI document the gateway serves about itself."""
    return schemathesis.openapi.from_url(f"{gateway_url}/schema/openapi.json")


schema = schemathesis.pytest.from_fixture("gateway_schema")


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_the_schema_allows_or_almost_allows_gets_a_500(case: schemathesis.Case) -> None:
    # With the admin token, the admin routes are exercised past their authentication too.
    case.call_and_validate(
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        checks=[checks.not_a_server_error, checks.content_type_conformance],
    )
