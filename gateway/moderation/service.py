"""The moderation path for one request: shape → decide thinking → admit → engine → parse → result."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from opentelemetry import trace

from gateway.engine.admission import AdmissionQueue
from gateway.engine.client import EngineAnswer, EngineClient, Usage
from gateway.engine.fairness import SHARED_FLOW, WorkModel
from gateway.engine.pool import EnginePool
from gateway.errors import (
    ClientError,
    EngineUnavailable,
    InvalidRequest,
    ModgateError,
    PayloadTooLarge,
    UnprocessableImage,
    UnsupportedMedia,
)
from gateway.http.auth import Caller
from gateway.moderation.remote_images import RemoteImageFetcher, is_remote_url
from gateway.moderation.shadow import ShadowSampler
from gateway.moderation.shaping_pool import ShapingPool
from gateway.moderation.verdict_cache import (
    FrameIdentity,
    MemoryVerdictCache,
    NearDuplicateRule,
    Reuse,
    ReusedVerdict,
    StoredVerdict,
    VerdictCache,
    VerdictScope,
)
from gateway.moderation.wire import (
    ImageURLPart,
    ModerationDetails,
    ModerationRequest,
    ModerationResponse,
    ModerationResult,
    TextPart,
)
from gateway.policy.rules import Mode, PolicyStore, QueueLoad, RequestContext, ThinkingDecision, decide
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics, RequestRecorder
from gateway.telemetry.tracing import engine_span_attributes
from gateway.telemetry.windows import RecentRequests
from shaping.accounting import PromptPrediction, TokenAccountant, compare_usage
from shaping.confidence import with_confidence
from shaping.errors import ImageRejected
from shaping.image import ImageLimits, ShapedImage, decode_data_url, shape_image
from shaping.prompt import RequestOptions, SystemPrompt, build_chat_request
from shaping.tokens import TokenGrid
from shaping.verdict import OPENAI_CATEGORIES, KeyframeVerdict, VerdictFormat, parse_engine_output

log = logging.getLogger("modgate.moderation")
T = TypeVar("T")


def image_rejection(exc: ImageRejected) -> ClientError:
    """Translate a shaping rejection into the gateway's client error of the same status."""
    kind: type[ClientError] = {413: PayloadTooLarge, 415: UnsupportedMedia, 422: UnprocessableImage}.get(
        exc.status, InvalidRequest
    )
    return kind(str(exc), code=exc.code, param="input")


@dataclass(frozen=True, slots=True)
class EngineModel:
    """What the engine serves: its model id, the weights' root (vLLM's ``root``) and a configured revision."""

    id: str
    root: str = ""
    revision: str = ""  # MODGATE_ENGINE__MODEL_REVISION

    @property
    def scope(self) -> str:
        """The model's part of the verdict-reuse scope."""
        return "\x1e".join((self.id, self.root, self.revision))


@dataclass(frozen=True, slots=True)
class FrameOutcome:
    """What one engine call produced for one frame."""

    verdict: KeyframeVerdict
    answer: EngineAnswer
    decision: ThinkingDecision
    queue_s: float
    verdicts: tuple[KeyframeVerdict, ...] = ()  # every frame's verdict of a packed engine call, in order
    reused: Reuse | None = None  # the verdict was not asked of the engine for this frame
    packed: int = 1  # frames in the engine request that judged this one


class ModerationService:
    """Everything a moderation request needs, built once per app."""

    def __init__(
        self,
        settings: Settings,
        engine: EngineClient,
        admission: AdmissionQueue,
        policies: PolicyStore,
        metrics: GatewayMetrics,
        system_prompts: Mapping[VerdictFormat, SystemPrompt],
        executor: Executor,
        tracer: trace.Tracer | None = None,
        recorder: RequestRecorder | None = None,
        remote_images: RemoteImageFetcher | None = None,
        verdicts: VerdictCache | None = None,
        engines: EnginePool | None = None,
    ) -> None:
        self.settings = settings
        self.remote_images = remote_images  # None: only data: URLs (MODGATE_REMOTE_IMAGES__ENABLED off)
        self.engine = engine
        self.admission = admission
        # Every engine behind the shared queue; without a pool given, ``engine`` alone with ``admission``.
        self.engines = engines or EnginePool.of_one(engine, admission)
        self.policies = policies
        self.load = QueueLoad(lambda: admission.queued)  # the load rule's signal and hysteresis (per replica)
        self.metrics = metrics
        self.system_prompts = dict(system_prompts)  # one per verdict format: each asks for its own form
        self.executor = executor  # a ShapingPool: each tenant's frames wait in a queue of their own
        self.work = WorkModel(settings.tenants.output_token_weight)  # engine work per call (fair share)
        self.tracer = tracer or trace.NoOpTracer()
        self.recorder = recorder or RequestRecorder(metrics, RecentRequests(settings.telemetry.window_s))
        self.model: EngineModel | None = None  # read from /v1/models, again every engine.model_recheck_s
        self._model_read_at = float("-inf")
        self._model_lock = asyncio.Lock()
        shaping = settings.shaping
        self.limits = ImageLimits(
            max_bytes=shaping.max_image_bytes,
            animated=shaping.animated,
            max_pixels_decoded=settings.limits.max_image_pixels,
        )
        self.grid = TokenGrid(
            pixels_per_token=shaping.pixels_per_token, token_budget=shaping.image_token_budget
        )
        self.verdicts: VerdictCache = verdicts or MemoryVerdictCache(
            shaping.verdict_cache_ttl_s,
            shaping.verdict_cache_max_entries,
            NearDuplicateRule(shaping.near_duplicate_distance, shaping.near_duplicate_colour_delta),
        )
        self.shadow: ShadowSampler | None = None  # set by open_services: shadow pairs for the quality module
        # built with the first request of each verdict format (needs the model id)
        self.accountants: dict[VerdictFormat, TokenAccountant] = {}
        self._accounting_lock = asyncio.Lock()
        self._accounting_paused_until = 0.0  # after a failed /tokenize: no prediction until then

    @property
    def system_prompt(self) -> SystemPrompt:
        """The system prompt of the verdict format the policy in force asks for."""
        return self.system_prompts[self.policies.current().verdict_format]

    async def engine_model(self) -> str:
        """The model id the engine requests name (``MODGATE_ENGINE__MODEL``, or the engine's first)."""
        return (await self.engine_identity()).id

    async def engine_identity(self) -> EngineModel:
        """What the engine serves now, re-read from ``/v1/models`` every ``engine.model_recheck_s`` seconds
        and after an engine failure (it may have restarted with other weights).

        A verdict is reused only under the same identity, so new weights never serve the old ones' verdicts.
        An engine that cannot be asked keeps the last identity known (its calls fail on their own).
        """
        engine = self.settings.engine
        if self.model is not None and time.monotonic() - self._model_read_at < engine.model_recheck_s:
            return self.model
        async with self._model_lock:  # concurrent requests read it once
            if self.model is not None and time.monotonic() - self._model_read_at < engine.model_recheck_s:
                return self.model
            try:
                cards = await self.engines.model_cards()
            except ModgateError:
                if self.model is None:
                    if engine.model == "auto":
                        raise
                    self.model = EngineModel(engine.model, "", engine.model_revision)  # named: usable
                self._model_read_at = time.monotonic()
                return self.model
            if engine.model == "auto":
                if not cards:
                    raise EngineUnavailable("the engine serves no model", code="engine_no_model")
                model_id, root = cards[0]
            else:
                model_id, root = engine.model, dict(cards).get(engine.model, "")
            found = EngineModel(model_id, root, engine.model_revision)
            if self.model is not None and found != self.model:
                log.warning(
                    "the engine's model changed from %s (root %r) to %s (root %r): verdicts made by the "
                    "old one are no longer reused", self.model.id, self.model.root, found.id, found.root,
                )
                self.accountant = None  # another model, another tokenizer: measure again
            self.model, self._model_read_at = found, time.monotonic()
            return found

    async def _off_loop(self, tenant: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the shaping threads, in ``tenant``'s queue if the pool has one."""
        if isinstance(self.executor, ShapingPool):
            return await asyncio.wrap_future(self.executor.submit_for(tenant, function, *args))
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def shape(self, data_url: str, tenant: str = SHARED_FLOW) -> ShapedImage:
        """Decode and shape one keyframe off the event loop (fetched first if it is an allowed remote URL)."""
        try:
            if self.remote_images is not None and is_remote_url(data_url):
                raw = await self.remote_images.fetch(data_url)
            else:
                _, raw = decode_data_url(data_url, self.settings.shaping.max_image_bytes)
            shape = functools.partial(shape_image, jpeg_quality=self.settings.shaping.jpeg_quality)
            return await self._off_loop(tenant, shape, raw, self.limits, self.grid)
        except ImageRejected as exc:
            raise image_rejection(exc) from exc

    async def moderate(
        self,
        request: ModerationRequest,
        caller: Caller,
        requested: Mode | None,
        packing: int | None = None,
        *,
        fresh: bool = False,
    ) -> ModerationResponse:
        """Answer one moderation request, as one trace; a request that fails is counted by its outcome.

        ``packing``: keyframes per engine request (default ``MODGATE_SHAPING__PACKING_K``). ``fresh``: do
        not reuse stored verdicts (``Cache-Control: no-cache``, e.g. the quality module's re-runs).
        """
        request_id = f"modr-{uuid.uuid4().hex}"
        with self.tracer.start_as_current_span("moderation", attributes={"modgate.request_id": request_id}):
            try:
                return await self._moderate(request, caller, requested, request_id, packing, fresh=fresh)
            except ModgateError as exc:
                self.recorder.failed(request_id, exc.default_code, exc.message)
                raise
            except asyncio.CancelledError:
                self.recorder.failed(request_id, "cancelled", "the caller went away")
                raise
            except Exception as exc:
                self.recorder.failed(request_id, "internal_error", type(exc).__name__)
                raise

    async def _moderate(
        self,
        request: ModerationRequest,
        caller: Caller,
        requested: Mode | None,
        request_id: str,
        packing: int | None = None,
        *,
        fresh: bool = False,
    ) -> ModerationResponse:
        """One result per image; text only: one per string of a list of strings, else one for the text."""
        started = time.monotonic()
        options = request.modgate
        images, texts = self._split_input(request)
        context = RequestContext(
            tenant=caller.tenant,
            requested=options.thinking if options and options.thinking else requested,
            tags=tuple(options.tags) if options else (),
            priority=options.priority if options else 0,
            requested_format=options.verdict_format if options else None,
        )
        policy = self.policies.current()
        decision = decide(policy, context, under_load=self.load.update(policy.load))
        shaping_started = time.monotonic()
        with self.tracer.start_as_current_span("shaping", attributes={"modgate.images": len(images)}):
            # all bad input fails before any engine call
            shaped = await asyncio.gather(*(self.shape(url, caller.tenant) for url in images))
        shaping_s = (time.monotonic() - shaping_started) / max(1, len(shaped))
        for _ in shaped:
            self.metrics.shaping.observe(shaping_s)
        extra_text = "\n".join(texts)
        if shaped:
            k = packing or self.settings.shaping.packing_k
            outcomes = await self._judge_frames(
                list(shaped), extra_text, decision, context, request_id, k, fresh=fresh
            )
            if self.shadow is not None and not extra_text:
                video_id = options.video_id if options else None
                for judged_frame, outcome in zip(shaped, outcomes, strict=True):
                    if (
                        outcome.reused is None and outcome.packed == 1
                    ):  # an engine verdict on this frame alone
                        self.shadow.consider(
                            policy,
                            judged_frame,
                            decision.mode,
                            outcome.verdict,
                            outcome.answer,
                            tenant=caller.tenant,
                            video_id=video_id,
                            verdict_format=decision.verdict_format,
                        )
        else:
            # Text only, judged for real: the canonical system prompt, the text as the user turn, the same
            # verdict parsing. A list of strings gets one result per string (OpenAI's rule), else one.
            pieces = texts if isinstance(request.input, list) and all(
                isinstance(item, str) for item in request.input
            ) else [extra_text]
            text_template = self.settings.shaping.text_user_text
            outcomes = list(await asyncio.gather(*(
                self._judge([], text_template.format(text=piece), decision, context, f"{request_id}-{index}")
                for index, piece in enumerate(pieces)
            )))
        results = []
        for index, outcome in enumerate(outcomes):
            frame = shaped[index] if shaped else None
            latency_s = time.monotonic() - started
            self.metrics.e2e.observe(latency_s)
            results.append(self._result(outcome, frame, latency_s, shaping_s if frame else 0.0))
            self.recorder.record(results[-1].modgate, request_id, caller.tenant)
        self.metrics.requests.labels("moderations", "ok").inc()
        return ModerationResponse(
            id=request_id, model=request.model or self.settings.model_name, results=results
        )

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
        top_logprobs = self.settings.engine.top_logprobs
        body = build_chat_request(
            self.system_prompts[decision.verdict_format],
            list(frames),
            user_text,
            RequestOptions(
                model=await self.engine_model(),
                enable_thinking=decision.mode == "on",
                # the policy's cap is per keyframe: K packed frames need K answers (and K times the thought)
                max_completion_tokens=decision.max_completion_tokens * max(1, len(frames)),
                constraint=self.settings.engine.verdict_constraint,
                stream=True,
                priority=context.priority if self.settings.engine.use_priority else None,
                thinking_token_budget=(
                    None
                    if decision.thinking_token_budget is None
                    else decision.thinking_token_budget * max(1, len(frames))
                ),
                verdict_format=decision.verdict_format,
                top_logprobs=top_logprobs,
            ),
        )
        prediction = await self._predict_prompt_tokens(
            frames, user_text, decision.mode == "on", decision.verdict_format
        )
        work = self.work.estimate(
            context.tenant, len(frames), decision.mode == "on",
            None if prediction is None else prediction.total,
        )
        queued_at = time.time_ns()  # span times are wall-clock nanoseconds
        try:
            async with self.engines.slot(priority=context.priority, work=work) as admission:
                self.tracer.start_span("queue", start_time=queued_at).end()
                self.metrics.queue_wait.observe(admission.queue_seconds)
                self.load.observe_queue_wait(admission.queue_seconds)
                with self.tracer.start_as_current_span("engine") as engine_span:
                    answer = await admission.chat(body, request_id)
                    usage = answer.usage
                    admission.settle(
                        self.work.actual(work, len(frames), usage.prompt_tokens, usage.completion_tokens)
                    )
                    engine_span.set_attributes(
                        engine_span_attributes(
                            request_id,
                            usage.prompt_tokens,
                            usage.cached_tokens,
                            usage.completion_tokens,
                            answer.ttft_s,
                            answer.streamed,
                        )
                    )
        except ModgateError as exc:
            self.metrics.engine_errors.labels(type(exc).__name__).inc()
            self._model_read_at = float("-inf")  # the engine may have restarted with other weights
            raise
        if answer.ttft_s is not None:
            self.metrics.ttft.observe(answer.ttft_s)
        self.metrics.prompt_tokens.inc(answer.usage.prompt_tokens)
        self.metrics.cached_tokens.inc(answer.usage.cached_tokens)
        self._check_prompt_tokens(prediction, answer, request_id)
        with self.tracer.start_as_current_span("parsing"):
            parsed = parse_engine_output(
                answer.content, answer.reasoning, answer.finish_reason, frames=max(1, len(frames))
            )
            verdicts = with_confidence(
                parsed.verdicts,
                answer.logprobs,
                answer.content,
                missing=(
                    "the engine returned no logprobs"
                    if top_logprobs > 0
                    else "logprobs are not asked of the engine (MODGATE_ENGINE__TOP_LOGPROBS=0)"
                ),
            )
        for problem in parsed.problems:
            self.metrics.unparsable.labels(problem).inc()
            log.warning("unusable engine output", extra={"request_id": request_id, "problem": problem})
        for judged in verdicts:
            self.metrics.frames.labels(judged.action, decision.mode).inc()
        return FrameOutcome(
            verdict=verdicts[0],
            answer=answer,
            decision=decision,
            queue_s=admission.queue_seconds,
            verdicts=verdicts,
            packed=max(1, len(frames)),
        )

    def _result(
        self, outcome: FrameOutcome, frame: ShapedImage | None, latency_s: float, shaping_s: float
    ) -> ModerationResult:
        verdict, answer, decision = outcome.verdict, outcome.answer, outcome.decision
        input_type: list[Literal["text", "image"]] = ["image"] if frame else ["text"]
        named = set(verdict.categories)
        usage = answer.usage
        if verdict.category_scores is not None:  # read from the engine's logprobs (shaping.confidence)
            scores = dict(verdict.category_scores)
            category_scores = {c: scores.get(c, 0.0) for c in OPENAI_CATEGORIES}
        else:  # no probabilities: a fixed mark for the categories the verdict names, 0.0 for the rest
            weight = 1.0 if verdict.action == "block" else 0.5
            category_scores = {c: weight if c in named else 0.0 for c in OPENAI_CATEGORIES}
        return ModerationResult(
            flagged=verdict.flagged,
            categories={c: c in named and verdict.action == "block" for c in OPENAI_CATEGORIES},
            category_scores=category_scores,
            category_applied_input_types=dict.fromkeys(OPENAI_CATEGORIES, input_type),
            modgate=ModerationDetails(
                action=verdict.action,
                reason=verdict.detail or None,
                confidence=verdict.confidence,
                confidence_reason=verdict.confidence_note if verdict.confidence is None else None,
                verdict_format=decision.verdict_format,
                thinking=decision.mode,
                thinking_rule=decision.rule,
                policy_version=decision.policy_version,
                latency_ms=round(latency_s * 1000, 2),
                queue_ms=round(outcome.queue_s * 1000, 2),
                shaping_ms=round(shaping_s * 1000, 2),
                ttft_ms=None if answer.ttft_s is None else round(answer.ttft_s * 1000, 2),
                decode_ms=None if answer.ttft_s is None else round((answer.total_s - answer.ttft_s) * 1e3, 2),
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                image_tokens=usage.image_tokens,
                completion_tokens=usage.completion_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                frame_sha256=frame.sha256 if frame else None,
                reused=outcome.reused,
                request_id=answer.request_id,
            ),
        )

    # --- request shaping that cuts the engine's work per keyframe (issue 4) --------------------------------

    async def _predict_prompt_tokens(
        self,
        frames: list[ShapedImage],
        user_text: str,
        enable_thinking: bool,
        verdict_format: VerdictFormat,
    ) -> PromptPrediction | None:
        """The prompt tokens this engine request should cost; what the accountant lacks is asked of /tokenize.

        A failing /tokenize never fails a moderation: prediction pauses for a minute, the request goes on.
        """
        if time.monotonic() < self._accounting_paused_until:
            return None
        accountant = self.accountants.get(verdict_format)
        if accountant is None:  # one per system prompt: each format's prompt counts its own tokens
            accountant = TokenAccountant(self.system_prompts[verdict_format].text, await self.engine_model())
            self.accountants[verdict_format] = accountant
        if accountant.pending(enable_thinking, user_text, frames):
            async with self._accounting_lock:  # concurrent first requests measure once
                try:
                    for _ in range(3):  # the image overhead is measured after the scaffold it is relative to
                        for measurement in accountant.pending(enable_thinking, user_text, frames):
                            counted = await self.engines.tokenize(measurement.body)
                            accountant.record(measurement, counted)
                except (ModgateError, KeyError, ValueError, TypeError) as exc:
                    self._accounting_paused_until = time.monotonic() + 60.0
                    log.warning("token prediction paused for 60 s: engine /tokenize failed: %s", exc)
                    return None
        return accountant.predict(enable_thinking, user_text, frames)

    def _check_prompt_tokens(
        self, prediction: PromptPrediction | None, answer: EngineAnswer, request_id: str
    ) -> None:
        """Count and log a request whose prompt tokens (or image tokens) the engine counted differently."""
        if prediction is None:
            return
        if answer.usage.prompt_tokens:  # an engine without usage gives nothing to compare with
            self.metrics.token_predictions.inc()
        mismatch = compare_usage(prediction, answer.usage.prompt_tokens, answer.usage.image_tokens)
        if mismatch is not None:
            self.metrics.token_mismatches.inc()
            log.warning(
                "token prediction mismatch: %s", mismatch.describe(), extra={"request_id": request_id}
            )

    def _instruction(self, frames: int, extra_text: str) -> str:
        """The user text of an engine request judging ``frames`` keyframes (plus any caller text)."""
        shaping = self.settings.shaping
        base = shaping.user_text if frames == 1 else shaping.packed_user_text.format(frames=frames)
        return base + (f"\n{extra_text}" if extra_text else "")

    async def _verdict_scope(self, tenant: str, decision: ThinkingDecision, extra_text: str) -> VerdictScope:
        return VerdictScope(
            tenant=tenant,
            policy_version=decision.policy_version,
            thinking=decision.mode,
            prompt_sha256=self.system_prompts[decision.verdict_format].sha256,
            text_sha256=hashlib.sha256(extra_text.encode()).hexdigest() if extra_text else "",
            model=(await self.engine_identity()).scope,
            verdict_format=decision.verdict_format,
        )

    def _identities(self, frames: list[ShapedImage]) -> list[FrameIdentity]:
        """Each frame's cache identity (made by the shaping step); the thumbnail only for near duplicates."""
        near = self.verdicts.rule.enabled
        return [
            FrameIdentity(frame.sha256, int(frame.phash, 16), frame.thumbnail if near else b"")
            for frame in frames
        ]

    @staticmethod
    def _share(outcome: FrameOutcome, position: int) -> FrameOutcome:
        """One frame's part of a packed engine call: its own verdict, an even share of the call's tokens."""
        k = outcome.packed
        if k == 1:
            return outcome
        usage = outcome.answer.usage

        def part(total: int) -> int:  # shares that add up to the total: the first frames take the remainder
            return total // k + (1 if position < total % k else 0)

        shared = Usage(
            prompt_tokens=part(usage.prompt_tokens),
            completion_tokens=part(usage.completion_tokens),
            cached_tokens=part(usage.cached_tokens),
            created_cache_tokens=part(usage.created_cache_tokens),
            image_tokens=part(usage.image_tokens),
            reasoning_tokens=part(usage.reasoning_tokens),
        )
        verdict = outcome.verdicts[position] if position < len(outcome.verdicts) else outcome.verdict
        return replace(outcome, verdict=verdict, answer=replace(outcome.answer, usage=shared))

    @staticmethod
    def _reused(
        verdict: KeyframeVerdict, how: Reuse, decision: ThinkingDecision, source_request_id: str
    ) -> FrameOutcome:
        """A verdict not asked of the engine for this frame: no tokens, the engine request that made it."""
        answer = EngineAnswer(
            content=None,
            reasoning=None,
            finish_reason="stop",
            usage=Usage(),
            ttft_s=None,
            total_s=0.0,
            request_id=source_request_id,
            streamed=False,
        )
        return FrameOutcome(verdict=verdict, answer=answer, decision=decision, queue_s=0.0, reused=how)

    async def _judge_frames(
        self,
        frames: list[ShapedImage],
        extra_text: str,
        decision: ThinkingDecision,
        context: RequestContext,
        request_id: str,
        packing: int,
        *,
        fresh: bool = False,
    ) -> list[FrameOutcome]:
        """One outcome per frame, in order, asking the engine only about frames it has not judged.

        A frame reuses a verdict made in the same scope (tenant, policy version, thinking mode, prompt,
        caller text, the engine's model) for the same shaped bytes ("exact") or a near duplicate ("near"):
        from the verdict cache, or from an earlier frame of this request. The others go to the engine
        ``packing`` to a request (all of one caller, so one tenant). Fresh verdicts are stored for reuse;
        fallback "review" verdicts (unusable output) are not.
        """
        scope = await self._verdict_scope(context.tenant, decision, extra_text)
        identities = self._identities(frames)
        rule = self.verdicts.rule
        hits: list[ReusedVerdict | None] = [None] * len(frames)
        if self.settings.shaping.verdict_cache_ttl_s > 0 and not fresh:
            hits = list(await asyncio.gather(*(self.verdicts.lookup(scope, frame) for frame in identities)))
        outcomes: list[FrameOutcome | None] = [None] * len(frames)
        leaders: list[int] = []  # frames the engine judges
        followers: dict[int, tuple[int, Reuse]] = {}  # frame -> (earlier frame of this request it repeats)
        for index, identity in enumerate(identities):
            hit = hits[index]
            if hit is not None:
                stored = hit.stored
                outcomes[index] = self._reused(stored.verdict(), hit.reused, decision, stored.request_id)
                self.metrics.reused.labels(hit.reused).inc()
                continue
            twin: tuple[int, Reuse] | None = None
            for leader in leaders:
                if identities[leader].sha256 == identity.sha256:
                    twin = (leader, "exact")
                    break
                if twin is None and rule.matches(identity, identities[leader]) is not None:
                    twin = (leader, "near")
            if twin is None:
                leaders.append(index)
            else:
                followers[index] = twin
        chunks = [leaders[start : start + packing] for start in range(0, len(leaders), packing)]
        judged = await asyncio.gather(
            *(
                self._judge(
                    [frames[i] for i in chunk],
                    self._instruction(len(chunk), extra_text),
                    decision,
                    context,
                    f"{request_id}-{chunk[0]}",
                )
                for chunk in chunks
            )
        )
        for chunk, outcome in zip(chunks, judged, strict=True):
            for position, index in enumerate(chunk):
                outcomes[index] = self._share(outcome, position)
        for index, (leader, how) in followers.items():
            made = outcomes[leader]
            assert made is not None  # leaders were all judged above
            outcomes[index] = self._reused(made.verdict, how, decision, made.answer.request_id)
            self.metrics.reused.labels(how).inc()
        if self.settings.shaping.verdict_cache_ttl_s > 0:
            made_at = time.time()
            to_store = [
                StoredVerdict(
                    action=made.verdict.action,
                    categories=made.verdict.categories,
                    confidence=made.verdict.confidence,
                    category_scores=made.verdict.category_scores,
                    sha256=identities[index].sha256,
                    phash=identities[index].phash,
                    thumbnail=identities[index].thumbnail,
                    made_at=made_at,
                    request_id=made.answer.request_id,
                )
                for index in leaders
                if (made := outcomes[index]) is not None and made.verdict.problem is None
            ]
            await asyncio.gather(*(self.verdicts.store(scope, stored) for stored in to_store))
        return [outcome for outcome in outcomes if outcome is not None]
