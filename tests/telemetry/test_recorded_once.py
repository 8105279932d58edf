"""A finished request is recorded once, through one recorder: each sink moves by exactly one request
(Prometheus, the recent window, the OpenTelemetry instruments, the request span, the request log line), for
an answered request, a client's error and an engine failure."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deploy.keyframes import make_keyframe
from gateway.http.app import create_app
from gateway.http.providers import services_of
from gateway.http.services import Services
from gateway.settings import Settings
from tests.support import SimFactory, data_url, image_input


@dataclass(frozen=True)
class Case:
    body: dict[str, Any]
    status: int
    outcome: str
    engine_fails: bool = False


ANSWERED = Case({"input": image_input(make_keyframe("allow", seed=5))}, 200, "ok")
CLIENT_ERROR = Case({"input": [{"type": "image_url", "image_url": {"url": data_url(b"not a jpeg")}}]}, 415,
                    "unsupported_media_type")
ENGINE_FAILURE = Case({"input": image_input(make_keyframe("allow", seed=5))}, 502, "engine_bad_response",
                      engine_fails=True)


def counted(services: Services, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of one metric in the app's registry, by its labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in services.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def moved(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    """The labels whose value changed, and by how much."""
    return {labels: value - before.get(labels, 0.0) for labels, value in after.items()
            if value != before.get(labels, 0.0)}


@pytest.mark.parametrize("case", [ANSWERED, CLIENT_ERROR, ENGINE_FAILURE], ids=lambda case: case.outcome)
async def test_one_request_moves_each_sink_exactly_once(
    case: Case, start_sim: SimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    sim = start_sim()
    if case.engine_fails:
        async with httpx.AsyncClient() as client:
            (await client.post(f"{sim.url}/sim/faults", json={"error_rate": 1.0})).raise_for_status()
    settings = Settings(engine={"url": sim.url, "connect_retries": 0},
                        telemetry={"engine_scrape_interval_s": 0}, shaping={"verdict_cache_ttl_s": 0})
    exporter = InMemorySpanExporter()
    async with AsyncTestClient(create_app(settings)) as client:
        services = services_of(client.app)
        services.telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        requests = counted(services, "modgate_requests_total")
        seconds = counted(services, "modgate_request_seconds_count")
        tenant_frames = counted(services, "modgate_tenant_frames_total")
        with caplog.at_level(logging.INFO, logger="modgate.requests"):
            response = await client.post("/v1/moderations", json=case.body)
        assert response.status_code == case.status, response.text
        labels = (("outcome", case.outcome), ("route", "moderations"))
        assert moved(requests, counted(services, "modgate_requests_total")) == {labels: 1.0}
        assert moved(seconds, counted(services, "modgate_request_seconds_count")) == {
            (("outcome", case.outcome),): 1.0
        }
        answered = case.outcome == "ok"
        assert sum(moved(tenant_frames, counted(services, "modgate_tenant_frames_total")).values()) == (
            1.0 if answered else 0.0
        )
        assert len(services.recent.samples()) == (1 if answered else 0)
    request_spans = [span for span in exporter.get_finished_spans() if span.name == "moderation"]
    assert len(request_spans) == 1
    assert request_spans[0].attributes is not None
    assert request_spans[0].attributes["modgate.outcome"] == case.outcome
    assert len([record for record in caplog.records if record.name == "modgate.requests"]) == 1
