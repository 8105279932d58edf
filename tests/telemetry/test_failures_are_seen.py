"""Failures are seen where operators look: the failing-requests alert counts every server-side outcome, and
the latency histogram holds failed requests under their outcome."""

from __future__ import annotations

import re

import httpx
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

import gateway.http.app
from deploy.keyframes import make_keyframe
from gateway.errors import ModgateError, ServerSideError
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.monitoring.promql import alerts
from tests.support import image_input


def subclasses(cls: type[ModgateError]) -> set[type[ModgateError]]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= subclasses(sub)
    return found


def server_side_outcomes() -> set[str]:
    """Every outcome a server-side failure is counted under (the app imported: every error class exists)."""
    assert gateway.http.app.create_app is create_app
    return {error.default_code for error in subclasses(ServerSideError)} | {"internal_error"}


@pytest.mark.parametrize("alert", ["ModgateRequestsFailing", "ModgateJobRequestsFailing"])
def test_the_failing_requests_alerts_count_every_server_side_outcome(alert: str) -> None:
    (rule,) = [rule for rule in alerts() if rule["alert"] == alert]
    match = re.search(r'outcome=~"([^"]+)"', rule["expr"])
    assert match is not None
    counted = set(match.group(1).split("|"))

    assert "circuit_open" in server_side_outcomes()
    assert server_side_outcomes() - counted == set()


def request_seconds_counts(exposition: str) -> dict[str, float]:
    """``modgate_request_seconds_count`` by outcome."""
    return {
        sample.labels.get("outcome", ""): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "modgate_request_seconds_count"
    }


async def test_failed_requests_are_in_the_latency_histogram_under_their_outcome() -> None:
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(500, json={"error": {"message": "boom"}})

    settings = Settings(engine={"model": "m"}, circuit={"consecutive_failures": 2, "cooldown_s": 30})
    app = create_app(settings, engine_transport=httpx.MockTransport(engine))
    body = {"input": image_input(make_keyframe("allow", 320, 180))}
    async with AsyncTestClient(app) as client:
        statuses = [(await client.post("/v1/moderations", json=body)).status_code for _ in range(3)]
        exposition = (await client.get("/metrics")).text

    assert statuses == [502, 502, 503]
    assert request_seconds_counts(exposition) == {"engine_bad_response": 2.0, "circuit_open": 1.0}
