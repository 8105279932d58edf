"""A finished request is recorded once, through one recorder: each sink moves by exactly one request
(Prometheus, the recent window, the OpenTelemetry instruments, the request span, the request log line), for
an answered request, a client's error and an engine failure; a job's request moves its job's series instead
of the live ones."""

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
from gateway.caller import Caller
from gateway.errors import ModgateError
from gateway.http.app import create_app
from gateway.http.auth import KeyRing
from gateway.http.providers import services_of
from gateway.http.services import Services, open_services
from gateway.settings import Settings
from gateway.wire import ModerationRequest
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
LIVE = ("modgate_requests_total", "modgate_request_seconds_count", "modgate_tenant_request_seconds_count",
        "modgate_tenant_queue_wait_seconds_count")
"""The series a live caller's wait is judged by: a job's requests never move them."""
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


@pytest.mark.parametrize("case", [ANSWERED, CLIENT_ERROR], ids=lambda case: case.outcome)
async def test_a_jobs_request_moves_its_job_series_once_and_no_live_sink(
    case: Case, start_sim: SimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    sim = start_sim()
    settings = Settings(engine={"url": sim.url, "connect_retries": 0},
                        telemetry={"engine_scrape_interval_s": 0}, shaping={"verdict_cache_ttl_s": 0})
    caller = Caller(tenant="default", key_id="job", job_id="job-1", job_kind="video")
    async with open_services(settings, KeyRing({}, None)) as services:
        live = [counted(services, name) for name in LIVE]
        jobs = counted(services, "modgate_job_requests_total")
        tenant_frames = counted(services, "modgate_tenant_frames_total")
        request = ModerationRequest.model_validate(case.body)
        with caplog.at_level(logging.INFO, logger="modgate.requests"):
            if case.outcome == "ok":
                await services.moderation.moderate(request, caller, None)
            else:
                with pytest.raises(ModgateError, match="image"):
                    await services.moderation.moderate(request, caller, None)
        assert moved(jobs, counted(services, "modgate_job_requests_total")) == {
            (("kind", "video"), ("outcome", case.outcome)): 1.0
        }
        assert [counted(services, name) for name in LIVE] == live
        assert services.recent.samples() == []
        answered = case.outcome == "ok"  # its frame is work done for the tenant all the same
        assert sum(moved(tenant_frames, counted(services, "modgate_tenant_frames_total")).values()) == (
            1.0 if answered else 0.0
        )
    (line,) = [record for record in caplog.records if record.name == "modgate.requests"]
    assert line.__dict__["job"] == "video"
