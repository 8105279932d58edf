"""One OpenTelemetry trace per request (shaping, queue, engine, parsing spans), OTLP export when an endpoint
is configured, OpenTelemetry metrics, and JSON log lines that carry ids but never image bytes or keys."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.caller import Caller
from gateway.errors import UpstreamError
from gateway.http.auth import KeyRing
from gateway.http.services import Services, open_services
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings, TelemetrySettings
from gateway.telemetry.recorder import FinishedRequest, RequestRecorder
from gateway.telemetry.tracing import JsonLogFormatter, build_telemetry
from gateway.telemetry.windows import RecentRequests
from gateway.wire import ModerationDetails, ModerationRequest
from tests.support import SimFactory, data_url, image_input

CALLER = Caller(tenant="t", key_id="test")


def request_for(*frames: bytes) -> ModerationRequest:
    return ModerationRequest.model_validate({"input": image_input(*frames)})


@asynccontextmanager
async def services_for(sim: ThreadedServer, **telemetry: Any) -> AsyncIterator[Services]:
    settings = Settings(engine={"url": sim.url}, telemetry={"engine_scrape_interval_s": 0, **telemetry})
    async with open_services(settings, KeyRing({}, None)) as services:
        yield services


async def test_a_request_is_one_trace_with_shaping_queue_engine_and_parsing_spans(
    start_sim: SimFactory,
) -> None:
    exporter = InMemorySpanExporter()
    async with services_for(start_sim()) as services:
        services.telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        request = request_for(make_keyframe("allow", seed=3))
        response = await services.moderation.moderate(request, CALLER, None)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"moderation", "shaping", "queue", "engine", "parsing"}
    root = spans["moderation"]
    assert root.parent is None
    assert root.attributes is not None
    assert root.attributes["modgate.request_id"] == response.id
    for name in ("shaping", "queue", "engine", "parsing"):
        span = spans[name]
        assert span.context is not None
        assert root.context is not None
        assert span.context.trace_id == root.context.trace_id, name
        assert span.parent is not None, name
        assert span.parent.span_id == root.context.span_id, name
    engine = spans["engine"].attributes
    assert engine is not None
    assert engine["gen_ai.usage.input_tokens"] == response.results[0].modgate.prompt_tokens
    assert engine["modgate.engine.streamed"] is True
    assert engine["modgate.engine.request_id"] == response.results[0].modgate.request_id


async def test_a_failing_engine_call_marks_the_engine_span_as_an_error(start_sim: SimFactory) -> None:
    sim = start_sim()
    async with httpx.AsyncClient() as client:
        (await client.post(f"{sim.url}/sim/faults", json={"error_rate": 1.0})).raise_for_status()
    exporter = InMemorySpanExporter()
    async with services_for(sim) as services:
        services.telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        with pytest.raises(UpstreamError):  # the engine's 500 comes back as the gateway's 502
            await services.moderation.moderate(request_for(make_keyframe("allow", seed=3)), CALLER, None)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert not spans["engine"].status.is_ok
    assert not spans["moderation"].status.is_ok
    assert "parsing" not in spans


class FakeCollector:
    """An OTLP/HTTP receiver: records each POST (path, content type, body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, bytes]] = []

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        self.posts.append((scope["path"], headers.get(b"content-type", b"").decode(), body))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/x-protobuf")],
            }
        )
        await send({"type": "http.response.body", "body": b""})


async def test_traces_and_metrics_go_to_the_otlp_endpoint_when_one_is_configured(
    start_sim: SimFactory,
) -> None:
    collector = FakeCollector()
    with ThreadedServer(collector) as receiver:
        async with services_for(start_sim(), otlp_endpoint=receiver.url) as services:
            assert services.telemetry.otlp_endpoint == receiver.url
            await services.moderation.moderate(request_for(make_keyframe("allow", seed=4)), CALLER, None)
        # leaving open_services flushed both exporters
    paths = {path for path, _, _ in collector.posts}
    assert {"/v1/traces", "/v1/metrics"} <= paths
    names: set[str] = set()
    for path, content_type, body in collector.posts:
        assert content_type == "application/x-protobuf"
        if path == "/v1/traces":
            exported = ExportTraceServiceRequest.FromString(body)
            names |= {
                span.name for rs in exported.resource_spans for ss in rs.scope_spans for span in ss.spans
            }
    assert {"moderation", "shaping", "queue", "engine", "parsing"} <= names


def test_no_exporter_is_set_up_without_an_endpoint() -> None:
    telemetry = build_telemetry(TelemetrySettings())
    try:
        assert telemetry.otlp_endpoint is None
        assert telemetry.tracer_provider._active_span_processor._span_processors == ()
    finally:
        telemetry.shutdown()


def test_without_an_exporter_spans_and_instruments_are_not_built_for_nobody() -> None:
    """No span processor: spans are not recorded (they still carry ids, for the JSON logs' trace id); one
    added later is handed every span from then on. No metric reader: no request instruments to feed."""
    telemetry = build_telemetry(TelemetrySettings())
    try:
        assert telemetry.instruments is None
        with telemetry.tracer.start_as_current_span("moderation") as unexported:
            assert not unexported.is_recording()
            assert unexported.get_span_context().is_valid
            assert trace.get_current_span() is unexported  # what the JSON formatter reads its trace id from
            # a span inside it is not built: the unrecorded one around it stands for it
            with telemetry.tracer.start_as_current_span("shaping") as child:
                assert child is unexported
            assert telemetry.tracer.start_span("queue") is unexported
        exporter = InMemorySpanExporter()
        telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        with telemetry.tracer.start_as_current_span("moderation") as exported:
            assert exported.is_recording()
            telemetry.tracer.start_span("queue").end()
            with telemetry.tracer.start_as_current_span("engine") as engine:
                assert engine is not exported
                assert engine.is_recording()
        assert [span.name for span in exporter.get_finished_spans()] == ["queue", "engine", "moderation"]
    finally:
        telemetry.shutdown()
    with_reader = build_telemetry(TelemetrySettings(), metric_readers=[InMemoryMetricReader()])
    try:
        assert with_reader.instruments is not None
    finally:
        with_reader.shutdown()


def test_once_taken_spans_are_sampled_as_otel_traces_sampler_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    telemetry = build_telemetry(TelemetrySettings())
    try:
        exporter = InMemorySpanExporter()
        telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        with telemetry.tracer.start_as_current_span("moderation") as span:
            assert not span.is_recording()
        assert exporter.get_finished_spans() == ()
    finally:
        telemetry.shutdown()


def details(**changes: Any) -> ModerationDetails:
    fields: dict[str, Any] = {
        "action": "allow",
        "thinking": "on",
        "thinking_rule": "default",
        "policy_version": 1,
        "latency_ms": 900.0,
        "queue_ms": 5.0,
        "shaping_ms": 20.0,
        "ttft_ms": 300.0,
        "decode_ms": 570.0,
        "prompt_tokens": 1076,
        "cached_tokens": 0,
        "image_tokens": 660,
        "completion_tokens": 95,
        "reasoning_tokens": 80,
        "frame_sha256": "ab" * 32,
        "request_id": "modr-1-0",
    }
    return ModerationDetails(**{**fields, **changes})


def test_each_keyframe_is_recorded_as_opentelemetry_metrics() -> None:
    reader = InMemoryMetricReader()
    telemetry = build_telemetry(TelemetrySettings(), metric_readers=[reader])
    try:
        recorder = RequestRecorder(GatewayMetrics(), RecentRequests(60), telemetry.instruments)
        for request_id, answered in (("modr-1", details()), ("modr-2", details(request_id="modr-2-0"))):
            finished = FinishedRequest(request_id, "default", frames=1, results=[answered])
            recorder.finished(finished, latency_s=answered.latency_ms / 1000)
        data = reader.get_metrics_data()
    finally:
        telemetry.shutdown()
    assert data is not None
    points: dict[str, Any] = {
        metric.name: metric.data.data_points
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert points["modgate.request.duration"][0].count == 2
    assert points["modgate.request.duration"][0].sum == 1.8
    assert points["modgate.engine.time_to_first_token"][0].count == 2
    assert points["modgate.engine.decode.duration"][0].count == 2
    assert points["modgate.queue.wait"][0].count == 2
    assert points["modgate.shaping.duration"][0].count == 2
    tokens = {point.attributes["kind"]: point.value for point in points["modgate.tokens"]}
    assert tokens == {"prompt": 2152, "cached": 0, "image": 1320, "completion": 190, "reasoning": 160}


@contextmanager
def json_log_lines(logger_name: str) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLogFormatter())
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_each_keyframe_is_one_json_log_line_with_ids_timings_and_tokens(start_sim: SimFactory) -> None:
    exporter = InMemorySpanExporter()
    with json_log_lines("modgate.requests") as stream:
        async with services_for(start_sim()) as services:
            services.telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
            response = await services.moderation.moderate(
                request_for(make_keyframe("allow", seed=6), make_keyframe("review", seed=7)), CALLER, None
            )
    text = stream.getvalue()
    assert "data:" not in text
    assert "base64" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["request_id"] for line in lines] == [response.id, response.id]
    assert [line["engine_request_id"] for line in lines] == [r.modgate.request_id for r in response.results]
    root = next(span for span in exporter.get_finished_spans() if span.name == "moderation")
    assert root.context is not None
    for line in lines:
        assert line["logger"] == "modgate.requests"
        assert line["level"] == "info"
        assert line["outcome"] == "ok"
        assert line["ttft_ms"] is not None
        assert line["decode_ms"] is not None
        assert line["latency_ms"] > 0
        assert line["prompt_tokens"] > line["image_tokens"] > 0
        assert line["trace_id"] == format(root.context.trace_id, "032x")


def test_the_json_formatter_never_writes_image_bytes_or_keys() -> None:
    with json_log_lines("modgate.test") as stream:
        logging.getLogger("modgate.test").info(
            "posted %s",
            data_url(b"\xff\xd8" * 100),
            extra={
                "authorization": "Bearer key1",
                "api_key": "key1",
                "body": {"image_url": {"url": "data:x"}},
                "frame": b"\xff\xd8\xff",
                "request_id": "modr-9",
            },
        )
    line = json.loads(stream.getvalue())
    assert "key1" not in stream.getvalue()
    assert "data:" not in stream.getvalue()
    assert line["request_id"] == "modr-9"
    assert line["authorization"] == "<redacted>"
    assert line["api_key"] == "<redacted>"
    assert line["frame"] == "<3 bytes, not logged>"
    assert "not logged" in line["message"]
