"""One recorder for a finished moderation request, and for a job: every sink hears of each once, from here.

The moderation path fills one :class:`FinishedRequest` as it goes (who asked, how long shaping took, the
result of each frame) and hands it to :meth:`RequestRecorder.finished` once, whatever the outcome. The
recorder fans it out: Prometheus (``modgate_requests_total{route,outcome}``, ``modgate_request_seconds``,
the per-tenant and per-frame series), the recent window (``RecentRequests``), the OpenTelemetry request
instruments, the request span's outcome and one log line per frame (or one for a request that failed).

A request a job makes (a keyframes job's, or each chunk of a video job's frames) is background work, not a
live call: it is counted under its job (``modgate_job_requests_total{kind,outcome}``) and kept out of the
live series a caller's wait is judged by (``modgate_requests_total``, the latency histograms and objective,
the recent window and ``GET /stats``); its frames still count as work done (shaping, decode, reuse,
``modgate_tenant_frames_total``). How a job ended and what its video's cut found are recorded here too
(:meth:`RequestRecorder.job_finished`, :meth:`RequestRecorder.video_cut`).

What the moderation path finds as it goes (frames judged, escalations, token predictions, shadow
judgements) is counted through :class:`VerdictRecorder`, here too. What each engine call costs (slot wait,
time to first token, prompt and cached tokens, unusable outputs, engine errors) is the engine client's side
to count (gateway/engine/calls.py's ``CallFigures``): a call is not a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import trace

from gateway.caller import JobKind
from gateway.errors import ModgateError
from gateway.series.metrics import GatewayMetrics
from gateway.telemetry.tracing import RequestInstruments
from gateway.telemetry.windows import RecentRequests, RequestSample
from gateway.wire import ModerationDetails

if TYPE_CHECKING:
    # a video cut's coverage, read for its figures only: the cut itself (and PyAV) stays with the jobs
    from shaping.video import Coverage

request_log = logging.getLogger("modgate.requests")

OK = "ok"


@dataclass
class FinishedRequest:
    """One moderation request as its telemetry sees it, filled in while it runs and recorded once."""

    request_id: str
    tenant: str
    frames: int  # keyframes or text pieces asked about (a failed request's latency is observed once each)
    route: str = "moderations"
    job: JobKind | None = None  # made for a job of this kind: recorded under its job, not as a live request
    shaping_s: float | None = None  # per shaped image; None: nothing was shaped (text only, or bad input)
    shaped: int = 0
    results: list[ModerationDetails] = field(default_factory=list)  # one per frame answered


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def sample_of(details: ModerationDetails, request_id: str, tenant: str) -> RequestSample:
    """A frame's result as the recent window keeps it."""
    return RequestSample(
        tenant=tenant,
        request_id=request_id,
        action=details.action,
        thinking=details.thinking,
        reused=details.reused,
        end_to_end_s=details.latency_ms / 1000,
        queue_wait_s=details.queue_ms / 1000,
        shaping_s=details.shaping_ms / 1000,
        ttft_s=_seconds(details.ttft_ms),
        decode_s=_seconds(details.decode_ms),
        prompt_tokens=details.prompt_tokens,
        cached_tokens=details.cached_tokens,
        image_tokens=details.image_tokens,
        completion_tokens=details.completion_tokens,
        reasoning_tokens=details.reasoning_tokens,
        thinking_mode=details.thinking_mode,
        escalated=details.escalated_from is not None,
        escalation_skipped=details.escalation_skipped,
    )


class RequestRecorder:
    """Where a finished request's figures go (Prometheus, the recent window, OpenTelemetry, the log), and a
    job's (how it finished, its video's cut)."""

    def __init__(
        self, metrics: GatewayMetrics, recent: RecentRequests, instruments: RequestInstruments | None = None
    ) -> None:
        self.metrics = metrics
        self.recent = recent
        self.instruments = instruments

    @contextlib.contextmanager
    def recording(self, request: FinishedRequest) -> Iterator[None]:
        """Record ``request`` once when the block ends, timed from its start: ok, its error's code,
        ``cancelled`` (the caller went away) or ``internal_error`` (a fault of the gateway's own)."""
        started = time.monotonic()

        def done(outcome: str, error: str | None = None) -> None:
            self.finished(request, outcome, latency_s=time.monotonic() - started, error=error)

        try:
            yield
        except ModgateError as exc:
            done(exc.default_code, exc.message)
            raise
        except asyncio.CancelledError:
            done("cancelled", "the caller went away")
            raise
        except Exception as exc:
            done("internal_error", type(exc).__name__)
            raise
        done(OK)

    def finished(
        self, request: FinishedRequest, outcome: str = OK, *, latency_s: float, error: str | None = None
    ) -> None:
        """Record ``request`` once: ``outcome`` "ok" (each frame's result) or how it failed (``error``)."""
        metrics = self.metrics
        for _ in range(request.shaped):
            if request.shaping_s is not None:
                metrics.shaping.observe(request.shaping_s)
        if request.job is not None:
            metrics.job_requests.labels(request.job, outcome).inc()
        else:
            metrics.requests.labels(request.route, outcome).inc()
            for _ in range(max(1, request.frames) if outcome != OK else 0):
                metrics.e2e.labels(outcome).observe(latency_s)
        trace.get_current_span().set_attribute("modgate.outcome", outcome)
        if outcome != OK:
            request_log.info(
                "%s failed: %s",
                request.request_id,
                outcome,
                extra={"request_id": request.request_id, "outcome": outcome, "error": error,
                       "job": request.job},
            )
            return
        for details in request.results:
            self._frame(details, request)

    def _frame(self, details: ModerationDetails, request: FinishedRequest) -> None:
        """One answered frame: the work it took; for a live request, its latency, tenant figures and window
        sample; its log line."""
        metrics = self.metrics
        request_id, tenant = request.request_id, request.tenant
        sample = sample_of(details, request_id, tenant)
        if sample.decode_s is not None:
            metrics.decode.observe(sample.decode_s)
        if sample.reused is not None:
            metrics.reused.labels(sample.reused).inc()
        mode = details.thinking if sample.reused is None else "reused"
        metrics.tenant_frames.labels(tenant, mode).inc()
        if request.job is None:
            self.recent.add(sample)
            metrics.e2e.labels(OK).observe(sample.end_to_end_s)
            metrics.tenant_e2e.labels(tenant).observe(sample.end_to_end_s)
            if sample.reused is None:
                metrics.tenant_queue_wait.labels(tenant).observe(sample.queue_wait_s)
            if self.instruments is not None:
                self.instruments.record(sample)
        if not request_log.isEnabledFor(logging.INFO):
            return  # the line and its forty fields are not made for a level that drops them
        request_log.info(
            "%s %s thinking=%s e2e_ms=%.1f ttft_ms=%s prompt=%d cached=%d completion=%d",
            details.request_id,
            details.action,
            details.thinking,
            details.latency_ms,
            details.ttft_ms,
            details.prompt_tokens,
            details.cached_tokens,
            details.completion_tokens,
            extra={
                "request_id": request_id,
                "tenant": tenant,
                "job": request.job,
                "engine_request_id": details.request_id,  # for a reused verdict: the call that made it
                "outcome": OK,
                "action": details.action,
                "thinking": details.thinking,
                "thinking_rule": details.thinking_rule,
                "escalated_from": None if details.escalated_from is None else details.escalated_from.why,
                "escalation_skipped": details.escalation_skipped,
                "policy_version": details.policy_version,
                "reused": details.reused,
                "latency_ms": details.latency_ms,
                "queue_ms": details.queue_ms,
                "shaping_ms": details.shaping_ms,
                "ttft_ms": details.ttft_ms,
                "decode_ms": details.decode_ms,
                "prompt_tokens": details.prompt_tokens,
                "cached_tokens": details.cached_tokens,
                "image_tokens": details.image_tokens,
                "completion_tokens": details.completion_tokens,
                "reasoning_tokens": details.reasoning_tokens,
                "frame_sha256": details.frame_sha256,
            },
        )

    def job_finished(self, kind: JobKind, status: str, code: str) -> None:
        """A job finished (told once, by the gateway that completed it): its ``status``, and a failed one's
        error ``code``."""
        self.metrics.jobs.labels(kind, status).inc()
        if status == "failed":
            self.metrics.job_failures.labels(kind, code).inc()

    def video_cut(self, seconds: float, coverage: Coverage) -> None:
        """One video cut for a job: how long it took, its frames by stage and its largest gap."""
        metrics = self.metrics
        metrics.video_cut_seconds.observe(seconds)
        for stage, count in (("decoded", coverage.frames_decoded), ("covered", coverage.candidates),
                             ("sent", coverage.judged), ("reused", coverage.reused)):
            metrics.video_frames.labels(stage).inc(count)
        metrics.video_coverage_gap.observe(coverage.max_gap_ms / 1000)


class VerdictRecorder:
    """Where the moderation path counts what its verdicts came to as it makes them, figures of the request
    that its result does not carry: frames judged (by action and thinking mode), escalations asked or
    skipped, prompt-token predictions checked, shadow judgements. What the engine call itself cost is the
    engine client's to count (gateway/engine/calls.py)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def judged(self, action: str, thinking: bool) -> None:
        """A frame the engine judged (``thinking``: with thinking on)."""
        self.metrics.frames.labels(action, "on" if thinking else "off").inc()

    def escalated(self, why: str) -> None:
        """A fast verdict asked again with thinking on, by why."""
        self.metrics.escalations.labels(why).inc()

    def not_escalated(self, reason: str) -> None:
        """An unsure fast verdict answered fast anyway, by why (a cap, or the re-ask failed)."""
        self.metrics.escalations_skipped.labels(reason).inc()

    def prediction_compared(self) -> None:
        """A request whose predicted prompt tokens were compared with the engine's usage."""
        self.metrics.token_predictions.inc()

    def prediction_missed(self) -> None:
        """A request whose prompt tokens differed from the prediction."""
        self.metrics.token_mismatches.inc()

    def shadow(self, outcome: str) -> None:
        """One shadow judgement's outcome (recorded, skipped_busy, engine_error)."""
        self.metrics.shadow_pairs.labels(outcome).inc()
