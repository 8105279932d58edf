"""OpenTelemetry for one app: a tracer and a meter of its own, exported over OTLP/HTTP when configured.

Providers live on the app's services, never in OpenTelemetry's global slots: two apps in one process (tests,
the embedded engine) keep their spans and metrics apart, and nothing leaks from one test to the next. The
moderation path gets its tracer passed in. Also here: the JSON log formatter (one object per line, with the
trace id when a span is current; never image bytes or keys).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from gateway.settings import TelemetrySettings
from gateway.telemetry.windows import RequestSample

OTLP_TIMEOUT_S = 5.0  # an absent collector must not hold up the gateway's shutdown for long
METRIC_EXPORT_INTERVAL_MS = 15_000


class RequestInstruments:
    """OpenTelemetry instruments for moderated keyframes (the OTLP twin of the Prometheus metrics)."""

    def __init__(self, meter: Meter) -> None:
        def seconds(name: str, description: str) -> Any:
            return meter.create_histogram(name, unit="s", description=description)

        self.end_to_end = seconds("modgate.request.duration", "End-to-end latency per keyframe.")
        self.ttft = seconds("modgate.engine.time_to_first_token", "Engine time to first token.")
        self.decode = seconds("modgate.engine.decode.duration", "Engine time after the first token.")
        self.queue_wait = seconds("modgate.queue.wait", "Wait for an engine slot.")
        self.shaping = seconds("modgate.shaping.duration", "Image shaping per keyframe.")
        self.keyframes = meter.create_counter(
            "modgate.keyframes", unit="{keyframe}", description="Keyframes moderated."
        )
        self.tokens = meter.create_counter(
            "modgate.tokens", unit="{token}", description="Engine tokens by kind."
        )

    def record(self, sample: RequestSample) -> None:
        """One moderated keyframe."""
        attributes = {"action": sample.action, "thinking": sample.thinking, "reused": sample.reused or "no"}
        self.keyframes.add(1, attributes)
        self.end_to_end.record(sample.end_to_end_s, attributes)
        self.shaping.record(sample.shaping_s, attributes)
        if sample.reused is not None:
            return  # no engine call: no queue, no first token, no tokens
        self.queue_wait.record(sample.queue_wait_s, attributes)
        if sample.ttft_s is not None:
            self.ttft.record(sample.ttft_s, attributes)
        if sample.decode_s is not None:
            self.decode.record(sample.decode_s, attributes)
        for kind, count in (
            ("prompt", sample.prompt_tokens),
            ("cached", sample.cached_tokens),
            ("image", sample.image_tokens),
            ("completion", sample.completion_tokens),
            ("reasoning", sample.reasoning_tokens),
        ):
            if count is not None:  # image tokens of an engine that counts none: unknown, not 0
                self.tokens.add(count, {**attributes, "kind": kind})


class _WhileTaken(Sampler):
    """Spans recorded (as the SDK's own sampler says) only once a span processor takes them.

    With no exporter configured (and no test's processor), each span would be built, given its attributes
    and ended for nobody: a twentieth of the event loop's time per moderation. Without one, spans are not
    recorded; they still carry ids, so a JSON log line still names its trace."""

    def __init__(self, recorded: Sampler) -> None:
        self.taken = False
        self._recorded = recorded  # once taken: the SDK's own (OTEL_TRACES_SAMPLER, else parent-based)

    def should_sample(
        self, parent_context: Context | None, trace_id: int, name: str, kind: SpanKind | None = None,
        attributes: Attributes = None, links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if self.taken:
            return self._recorded.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )
        return SamplingResult(Decision.DROP, None, trace_state)

    def get_description(self) -> str:
        return "recorded while a span processor takes them"


class _TracerProvider(TracerProvider):
    """The SDK's provider, recording spans only while a span processor is there to take them."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource=resource, shutdown_on_exit=False)
        self.while_taken = _WhileTaken(self.sampler)  # before any tracer is made, which takes the sampler
        self.sampler = self.while_taken

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        """Add ``span_processor``; spans are recorded from now on."""
        super().add_span_processor(span_processor)
        self.while_taken.taken = True


class _Around(AbstractContextManager[Span]):
    """``start_as_current_span`` for a span not built: the one around it, current already, stands for it."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        return self.span

    def __exit__(self, *_exc: object) -> None:
        return None


class _ChildrenWhileTaken(Tracer):
    """The SDK's tracer, but while no span processor takes spans, a span begun inside an unrecorded one is
    not built at all: that one stands for it (its ids are what a log line would name either way). A request's
    root span is still made, with fresh ids; its four children (shaping, queue, engine, parsing) were each a
    sampler call, two random ids and a context attached and detached, for nobody."""

    def __init__(self, tracer: Tracer, sampler: _WhileTaken) -> None:
        self._tracer = tracer
        self._sampler = sampler

    def _standing_in(self, context: Context | None) -> Span | None:
        if self._sampler.taken:
            return None
        around = trace.get_current_span(context)
        if around.is_recording() or not around.get_span_context().is_valid:
            return None  # a root, or a span someone records (another provider's): built as usual
        return around

    def start_span(
        self, name: str, context: Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None, links: Sequence[Link] | None = None, start_time: int | None = None,
        record_exception: bool = True, set_status_on_exception: bool = True,
    ) -> Span:
        """A span (the unrecorded one around it, while spans are not taken)."""
        around = self._standing_in(context)
        if around is not None:
            return around
        return self._tracer.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )

    def start_as_current_span(  # type: ignore[override]  # the SDK names a private context-manager class
        self, name: str, context: Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None, links: Sequence[Link] | None = None, start_time: int | None = None,
        record_exception: bool = True, set_status_on_exception: bool = True, end_on_exit: bool = True,
    ) -> AbstractContextManager[Span]:
        """A span made current for the block (the unrecorded one around it, while spans are not taken)."""
        around = self._standing_in(context)
        if around is not None:
            return _Around(around)
        return self._tracer.start_as_current_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception,
            end_on_exit,
        )


@dataclass
class Telemetry:
    """One app's OpenTelemetry providers, its tracer and its request instruments."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    tracer: Tracer
    instruments: RequestInstruments | None  # None: no metric reader (no OTLP endpoint), nothing to record for
    otlp_endpoint: str | None

    def shutdown(self) -> None:
        """Flush and stop exporters (blocking: call it off the event loop)."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def build_telemetry(
    settings: TelemetrySettings,
    *,
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] = (),
) -> Telemetry:
    """Providers for one app; OTLP/HTTP exporters when ``settings.otlp_endpoint`` is set.

    ``span_exporter`` and ``metric_readers`` add in-memory sinks (tests); more span processors can be added
    later with ``telemetry.tracer_provider.add_span_processor``. Spans are recorded only while a span
    processor takes them, and the request instruments exist only with a metric reader: without an exporter,
    neither is built for nobody.
    """
    resource = Resource.create({"service.name": settings.service_name})
    readers: list[MetricReader] = list(metric_readers)
    tracer_provider = _TracerProvider(resource)
    endpoint = settings.otlp_endpoint
    if endpoint:
        tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=OTLP_TIMEOUT_S))
        )
        readers.append(
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics", timeout=OTLP_TIMEOUT_S),
                export_interval_millis=METRIC_EXPORT_INTERVAL_MS,
            )
        )
    if span_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    meter_provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    return Telemetry(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        tracer=_ChildrenWhileTaken(
            tracer_provider.get_tracer("modgate.gateway"), tracer_provider.while_taken
        ),
        instruments=RequestInstruments(meter_provider.get_meter("modgate.gateway")) if readers else None,
        otlp_endpoint=endpoint,
    )


def engine_span_attributes(
    request_id: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
    ttft_s: float | None, streamed: bool,
) -> dict[str, Any]:
    """What the engine span carries: enough to tell a slow prefill from a long answer."""
    attributes: dict[str, Any] = {
        "modgate.engine.request_id": request_id,
        "gen_ai.usage.input_tokens": prompt_tokens,
        "gen_ai.usage.output_tokens": completion_tokens,
        "modgate.engine.cached_tokens": cached_tokens,
        "modgate.engine.streamed": streamed,
    }
    if ttft_s is not None:
        attributes["modgate.engine.ttft_ms"] = round(ttft_s * 1000, 2)
    return attributes


# LogRecord's own attributes: everything else on a record came from ``extra=`` and is logged as a field
# (but uvicorn's "color_message", the message again with terminal colour codes).
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "color_message",
}
# Never logged, whatever a caller passes: credentials and image payloads.
_SECRET_FIELDS = frozenset({"authorization", "api_key", "key", "token", "admin_token", "image", "image_bytes",
                            "data_url", "url", "secret", "password"})
_MAX_FIELD_CHARS = 2_000


_DATA_URL = re.compile(r"data:[\w.+/-]*(;[\w=.+-]+)*,[A-Za-z0-9+/=%_-]*")


def _without_data_urls(text: str) -> str:
    return _DATA_URL.sub(lambda m: f"<data URL, {len(m.group())} characters, not logged>", text)


def _safe(value: Any) -> Any:
    """A JSON-ready value with image payloads cut out (a ``data:`` URL is bytes, whatever its field name)."""
    if isinstance(value, str):
        value = _without_data_urls(value)
        return value if len(value) <= _MAX_FIELD_CHARS else value[:_MAX_FIELD_CHARS] + "…"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes, not logged>"
    if isinstance(value, int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {
            str(k): "<redacted>" if str(k).lower() in _SECRET_FIELDS else _safe(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_safe(v) for v in value]
    return _safe(str(value))


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the ``extra=`` fields, and the trace id."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record."""
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _safe(record.getMessage()),
        }
        for name, value in vars(record).items():
            if name in _RECORD_FIELDS or name.startswith("_"):
                continue
            entry[name] = "<redacted>" if name.lower() in _SECRET_FIELDS else _safe(value)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = format(context.trace_id, "032x")
            entry["span_id"] = format(context.span_id, "016x")
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, json_logs: bool) -> None:
    """The process's logging: plain lines, or JSON lines for a log pipeline (MODGATE_TELEMETRY__JSON_LOGS)."""
    handler = logging.StreamHandler()
    plain = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    handler.setFormatter(JsonLogFormatter() if json_logs else plain)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # httpx logs every request at INFO: one line per engine call and scrape drowns the gateway's own lines.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
