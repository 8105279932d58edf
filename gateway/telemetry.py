"""Gateway metrics in Prometheus form (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0)


class GatewayMetrics:
    """The gateway's own metrics, in a registry of its own (one per app, so tests do not share state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "modgate_requests", "Moderation requests by outcome.", ["route", "outcome"], registry=registry
        )
        self.frames = Counter(
            "modgate_frames", "Keyframes moderated, by action and thinking mode.", ["action", "thinking"],
            registry=registry,
        )
        self.unparsable = Counter(
            "modgate_unparsable_outputs", "Engine outputs that could not be used as a verdict.", ["problem"],
            registry=registry,
        )
        self.reused = Counter("modgate_reused_verdicts", "Verdicts reused from the cache.", ["kind"], registry=registry)
        self.engine_errors = Counter("modgate_engine_errors", "Engine call failures.", ["kind"], registry=registry)
        self.e2e = Histogram(
            "modgate_request_seconds", "End-to-end latency per keyframe.", buckets=LATENCY_BUCKETS, registry=registry
        )
        self.ttft = Histogram(
            "modgate_engine_ttft_seconds", "Engine time to first token.", buckets=LATENCY_BUCKETS, registry=registry
        )
        self.queue_wait = Histogram(
            "modgate_queue_wait_seconds", "Wait for an engine slot.", buckets=LATENCY_BUCKETS, registry=registry
        )
        self.shaping = Histogram(
            "modgate_shaping_seconds", "Image shaping per keyframe.", buckets=LATENCY_BUCKETS, registry=registry
        )
        self.inflight = Gauge("modgate_engine_inflight", "Requests in flight to the engine.", registry=registry)
        self.queued = Gauge("modgate_engine_queued", "Requests waiting for an engine slot.", registry=registry)
        self.prompt_tokens = Counter("modgate_prompt_tokens", "Prompt tokens sent.", registry=registry)
        self.cached_tokens = Counter("modgate_cached_tokens", "Prompt tokens served from the prefix cache.",
                                     registry=registry)
        self.token_mismatches = Counter(
            "modgate_token_prediction_mismatches", "Requests whose prompt tokens differed from the prediction.",
            registry=registry,
        )
