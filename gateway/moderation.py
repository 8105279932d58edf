"""The moderation path for one request: shape → decide thinking → admit → engine → parse → result."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from concurrent.futures import Executor
from dataclasses import dataclass

from gateway.admission import AdmissionQueue
from gateway.auth import Caller
from gateway.engine_client import EngineAnswer, EngineClient
from gateway.errors import (
    ClientError,
    InvalidRequest,
    ModgateError,
    PayloadTooLarge,
    UnprocessableImage,
    UnsupportedMedia,
)
from gateway.policy import Mode, PolicyStore, RequestContext, ThinkingDecision, decide
from gateway.settings import Settings
from gateway.telemetry import GatewayMetrics
from gateway.wire import (
    ImageURLPart,
    ModerationDetails,
    ModerationRequest,
    ModerationResponse,
    ModerationResult,
    TextPart,
)
from shaping.errors import ImageRejected
from shaping.image import ImageLimits, ShapedImage, decode_data_url, shape_image
from shaping.prompt import RequestOptions, SystemPrompt, build_chat_request
from shaping.tokens import TokenGrid
from shaping.verdict import OPENAI_CATEGORIES, KeyframeVerdict, parse_engine_output

log = logging.getLogger("modgate.moderation")


def image_rejection(exc: ImageRejected) -> ClientError:
    """Translate a shaping rejection into the gateway's client error of the same status."""
    kind: type[ClientError] = {413: PayloadTooLarge, 415: UnsupportedMedia, 422: UnprocessableImage}.get(
        exc.status, InvalidRequest
    )
    return kind(str(exc), code=exc.code, param="input")


@dataclass(frozen=True, slots=True)
class FrameOutcome:
    """What one engine call produced for one frame."""

    verdict: KeyframeVerdict
    answer: EngineAnswer
    decision: ThinkingDecision
    queue_s: float


class ModerationService:
    """Everything a moderation request needs, built once per app."""

    def __init__(
        self,
        settings: Settings,
        engine: EngineClient,
        admission: AdmissionQueue,
        policies: PolicyStore,
        metrics: GatewayMetrics,
        system_prompt: SystemPrompt,
        executor: Executor,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.admission = admission
        self.policies = policies
        self.metrics = metrics
        self.system_prompt = system_prompt
        self.executor = executor
        self.model_id: str | None = None if settings.engine.model == "auto" else settings.engine.model
        shaping = settings.shaping
        self.limits = ImageLimits(max_bytes=shaping.max_image_bytes, animated=shaping.animated)
        self.grid = TokenGrid(pixels_per_token=shaping.pixels_per_token, token_budget=shaping.image_token_budget)

    async def engine_model(self) -> str:
        """The engine's model id, asked once (``MODGATE_ENGINE__MODEL=auto``)."""
        if self.model_id is None:
            models = await self.engine.model_ids()
            if not models:
                raise InvalidRequest("the engine serves no model")
            self.model_id = models[0]
        return self.model_id

    async def shape(self, data_url: str) -> ShapedImage:
        """Decode and shape one keyframe off the event loop."""
        try:
            _, raw = decode_data_url(data_url, self.settings.shaping.max_image_bytes)
            loop = asyncio.get_running_loop()
            shape = functools.partial(shape_image, jpeg_quality=self.settings.shaping.jpeg_quality)
            return await loop.run_in_executor(self.executor, shape, raw, self.limits, self.grid)
        except ImageRejected as exc:
            raise image_rejection(exc) from exc

    async def moderate(self, request: ModerationRequest, caller: Caller, requested: Mode | None) -> ModerationResponse:
        """Answer one moderation request: one result per image (or one for a text-only input)."""
        started = time.monotonic()
        request_id = f"modr-{uuid.uuid4().hex}"
        options = request.modgate
        images, texts = self._split_input(request)
        context = RequestContext(
            tenant=caller.tenant,
            requested=options.thinking if options and options.thinking else requested,
            tags=tuple(options.tags) if options else (),
            priority=options.priority if options else 0,
        )
        decision = decide(self.policies.current(), context)
        shaping_started = time.monotonic()
        shaped = await asyncio.gather(*(self.shape(url) for url in images))  # all bad input fails before any engine call
        shaping_s = (time.monotonic() - shaping_started) / max(1, len(shaped))
        for _ in shaped:
            self.metrics.shaping.observe(shaping_s)
        extra_text = "\n".join(texts)
        user_text = self.settings.shaping.user_text + (f"\n{extra_text}" if extra_text else "")
        if shaped:
            calls = [self._judge([frame], user_text, decision, context, f"{request_id}-{i}") for i, frame in enumerate(shaped)]
        else:
            calls = [self._judge([], f"请审核以下文本：\n{extra_text}", decision, context, f"{request_id}-0")]
        outcomes = await asyncio.gather(*calls)
        results = []
        for index, outcome in enumerate(outcomes):
            frame = shaped[index] if shaped else None
            latency_s = time.monotonic() - started
            self.metrics.e2e.observe(latency_s)
            results.append(self._result(outcome, frame, latency_s, shaping_s if frame else 0.0))
        self.metrics.requests.labels("moderations", "ok").inc()
        return ModerationResponse(id=request_id, model=request.model or self.settings.model_name, results=results)

    @staticmethod
    def _split_input(request: ModerationRequest) -> tuple[list[str], list[str]]:
        if isinstance(request.input, str):
            return [], [request.input]
        images: list[str] = []
        texts: list[str] = []
        for item in request.input:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, ImageURLPart):
                images.append(item.image_url.url)
            elif isinstance(item, TextPart):
                texts.append(item.text)
        return images, texts

    async def _judge(
        self,
        frames: list[ShapedImage],
        user_text: str,
        decision: ThinkingDecision,
        context: RequestContext,
        request_id: str,
    ) -> FrameOutcome:
        body = build_chat_request(
            self.system_prompt,
            list(frames),
            user_text,
            RequestOptions(
                model=await self.engine_model(),
                enable_thinking=decision.mode == "on",
                max_completion_tokens=decision.max_completion_tokens,
                constraint=self.settings.engine.verdict_constraint,
                stream=True,
                priority=context.priority if self.settings.engine.use_priority else None,
                thinking_token_budget=decision.thinking_token_budget,
            ),
        )
        try:
            async with self.admission.slot(priority=context.priority) as admission:
                self.metrics.queue_wait.observe(admission.queue_seconds)
                answer = await self.engine.chat(body, request_id)
        except ModgateError as exc:
            self.metrics.engine_errors.labels(type(exc).__name__).inc()
            raise
        if answer.ttft_s is not None:
            self.metrics.ttft.observe(answer.ttft_s)
        self.metrics.prompt_tokens.inc(answer.usage.prompt_tokens)
        self.metrics.cached_tokens.inc(answer.usage.cached_tokens)
        parsed = parse_engine_output(answer.content, answer.reasoning, answer.finish_reason, frames=max(1, len(frames)))
        for problem in parsed.problems:
            self.metrics.unparsable.labels(problem).inc()
            log.warning("unusable engine output", extra={"request_id": request_id, "problem": problem})
        verdict = parsed.verdicts[0]
        self.metrics.frames.labels(verdict.action, decision.mode).inc()
        return FrameOutcome(verdict=verdict, answer=answer, decision=decision, queue_s=admission.queue_seconds)

    def _result(
        self, outcome: FrameOutcome, frame: ShapedImage | None, latency_s: float, shaping_s: float
    ) -> ModerationResult:
        verdict, answer, decision = outcome.verdict, outcome.answer, outcome.decision
        input_type: list[str] = ["image"] if frame else ["text"]
        named = set(verdict.categories)
        weight = 1.0 if verdict.action == "block" else 0.5
        usage = answer.usage
        return ModerationResult(
            flagged=verdict.flagged,
            categories={c: c in named and verdict.action == "block" for c in OPENAI_CATEGORIES},
            category_scores={c: round(verdict.confidence * weight, 4) if c in named else 0.0 for c in OPENAI_CATEGORIES},
            category_applied_input_types={c: input_type for c in OPENAI_CATEGORIES},  # type: ignore[misc]
            modgate=ModerationDetails(
                action=verdict.action,
                reason=verdict.detail or None,
                thinking=decision.mode,
                thinking_rule=decision.rule,
                policy_version=decision.policy_version,
                latency_ms=round(latency_s * 1000, 2),
                queue_ms=round(outcome.queue_s * 1000, 2),
                shaping_ms=round(shaping_s * 1000, 2),
                ttft_ms=None if answer.ttft_s is None else round(answer.ttft_s * 1000, 2),
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                image_tokens=usage.image_tokens,
                completion_tokens=usage.completion_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                frame_sha256=frame.sha256 if frame else None,
                request_id=answer.request_id,
            ),
        )
