"""The moderation path for one request: shape → decide thinking → reuse or judge → escalate → result.

The service orchestrates; the jobs live beside it: ``frame_input`` (a request's frames, decoded and shaped),
``frame_reuse`` (which frames the engine judges),
``engine_call`` (one engine call: request, admission, parsing, confidence), ``escalation`` (re-asking unsure
verdicts), ``outcome`` (a frame's outcome and its wire result).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

from opentelemetry import trace

from gateway.caller import Caller
from gateway.decisions.log import DecisionLog, MemoryDecisionLog
from gateway.decisions.rows import decision_row
from gateway.engine.admission import AdmissionQueue
from gateway.engine.client import EngineClient
from gateway.engine.fairness import SHARED_FLOW, WorkModel
from gateway.engine.leases import LeaseRider
from gateway.engine.pool import EnginePool, SlotWithheld
from gateway.errors import (
    EngineUnavailable,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.moderation.engine_call import FrameJudge
from gateway.moderation.engine_identity import EngineIdentity, EngineModel
from gateway.moderation.escalation import Escalation
from gateway.moderation.frame_input import Frame, shape_frame, split_input
from gateway.moderation.frame_reuse import (
    frame_identities,
    plan_frames,
    verdict_scope,
    verdicts_to_keep,
)
from gateway.moderation.outcome import (
    FrameOutcome,
    Provenance,
    engine_failure_outcome,
    moderation_result,
    packed_share,
    reused_outcome,
    under_moderation_policy,
)
from gateway.moderation.remote_images import RemoteImageFetcher
from gateway.moderation.shadow import ShadowSampler
from gateway.moderation.token_prediction import PromptTokenCheck
from gateway.moderation.verdict_cache import (
    FrameIdentity,
    MemoryVerdictCache,
    NearDuplicateRule,
    ReusedVerdict,
    RidingLookup,
    VerdictCache,
    VerdictScope,
    lookup_failed,
    store_failed,
)
from gateway.policy.rules import (
    EscalationBudget,
    Mode,
    PolicyStore,
    QueueLoad,
    RequestContext,
    ThinkingDecision,
    ThinkingPolicy,
    decide,
)
from gateway.review.models import ReviewItem
from gateway.review.service import ReviewQueue
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.tasks import together
from gateway.telemetry.recorder import FinishedRequest, RequestRecorder
from gateway.telemetry.windows import RecentRequests
from gateway.wire import (
    ModerationRequest,
    ModerationResponse,
)
from shaping.image import ImageLimits, ShapedImage
from shaping.prompt import SystemPrompt
from shaping.tokens import TokenGrid
from shaping.verdict import VerdictFormat

log = logging.getLogger("modgate.moderation")
T = TypeVar("T")
# What a tenant's ``on_engine_failure: review`` answers ``review`` for (the circuit's refusal included);
# a full queue (429) and bad input are not engine failures.
ENGINE_FAILURES = (EngineUnavailable, UpstreamError, UpstreamTimeout)


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
        self.escalations = EscalationBudget(lambda: admission.queued)  # escalate's caps (per replica)
        self.metrics = metrics
        self.system_prompts = dict(system_prompts)  # one per verdict format: each asks for its own form
        self.executor = executor  # a ShapingPool: each tenant's frames wait in a queue of their own
        # engine work per call (fair share); its output weight learned from the engine unless it was set
        self.work = WorkModel(
            settings.tenants.output_token_weight,
            learn_weight="output_token_weight" not in settings.tenants.model_fields_set,
        )
        metrics.watch_output_token_weight(lambda: self.work.output_token_weight)
        self.tracer = tracer or trace.NoOpTracer()
        self.recorder = recorder or RequestRecorder(metrics, RecentRequests(settings.telemetry.window_s))
        self.in_flight = 0  # moderations this process is answering now (a lone frame's decode: shape_frame)
        self.identity = EngineIdentity(settings.engine, self.engines)  # the model verdicts are reused under
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
        self.review: ReviewQueue | None = None  # set by open_services: frames people should label
        # every answered verdict (gateway/decisions); open_services puts it on Redis when there is one
        self.decisions: DecisionLog = MemoryDecisionLog(settings.decisions)
        self.judge = FrameJudge(
            settings.engine,
            self.system_prompts,
            self.engines,
            self.identity,
            PromptTokenCheck(
                self.system_prompts, self.engines, self.engine_model, metrics, self.identity.model_ids
            ),
            self.work,
            self.load,
            metrics,
            self.tracer,
        )
        self.escalation = Escalation(self.judge, self.escalations, metrics)

    @property
    def system_prompt(self) -> SystemPrompt:
        """The system prompt of the verdict format the policy in force asks for."""
        return self.system_prompts[self.policies.current().verdict_format]

    async def engine_model(self) -> str:
        """The model id the engine requests name (``MODGATE_ENGINE__MODEL``, or the engine's first)."""
        return (await self.engine_identity()).id

    async def engine_identity(self) -> EngineModel:
        """What the engine serves now, re-read from ``/v1/models`` every ``engine.model_recheck_s`` seconds
        and after an engine failure (it may have restarted with other weights)."""
        return await self.identity.current()

    async def shape(
        self, frame: Frame, tenant: str = SHARED_FLOW, *, identity: bool = True, lone: bool = False,
        busy: bool = False,
    ) -> ShapedImage:
        """Decode and shape one keyframe (fetched first if it is an allowed remote URL) on a shaping thread,
        or on the loop if it is its request's ``lone`` frame and passes through, its decode on a thread if
        the gateway is ``busy`` (``shape_frame``); ``identity``: with the pHash and thumbnail that verdict
        reuse compares (``shape_image``)."""
        return await shape_frame(
            frame, tenant, executor=self.executor, limits=self.limits, grid=self.grid,
            jpeg_quality=self.settings.shaping.jpeg_quality, remote_images=self.remote_images,
            identity=identity, lone=lone, busy=busy,
        )

    @property
    def keeps_verdicts(self) -> bool:
        """The verdict cache is on (``MODGATE_SHAPING__VERDICT_CACHE_TTL_S`` > 0)."""
        return self.settings.shaping.verdict_cache_ttl_s > 0

    def needs_identity(self, frames: int) -> bool:
        """Whether a request of ``frames`` images needs their pHashes and thumbnails: the verdict cache
        looks each up, or near-duplicate reuse compares its frames with each other (exact repeats are found
        by their SHA-256, which every shaped frame has)."""
        return self.keeps_verdicts or (frames > 1 and self.verdicts.rule.enabled)

    async def moderate(
        self,
        request: ModerationRequest,
        caller: Caller,
        requested: Mode | None,
        packing: int | None = None,
        *,
        fresh: bool = False,
        decision_ids: Sequence[str] | None = None,
    ) -> ModerationResponse:
        """Answer one moderation request, as one trace; a request that fails is counted by its outcome.

        ``packing``: keyframes per engine request (default ``MODGATE_SHAPING__PACKING_K``). ``fresh``: do
        not reuse stored verdicts (``Cache-Control: no-cache``, e.g. the quality module's re-runs).
        ``decision_ids``: the results' ids, one per image (a video job's: stable per job and frame).
        """
        request_id = f"modr-{uuid.uuid4().hex}"
        # a job's request (its keyframes, a chunk of its video) is recorded under the job, not as a live call
        record = FinishedRequest(
            request_id, caller.tenant, frames=len(split_input(request)[0]), job=caller.job_kind
        )
        span = self.tracer.start_as_current_span("moderation", attributes={"modgate.request_id": request_id})
        self.in_flight += 1
        try:
            with span, self.recorder.recording(record):  # the outcome is set on the span before it ends
                return await self._moderate(request, caller, requested, record, packing, fresh=fresh,
                                            decision_ids=decision_ids)
        finally:
            self.in_flight -= 1

    async def _moderate(
        self,
        request: ModerationRequest,
        caller: Caller,
        requested: Mode | None,
        record: FinishedRequest,
        packing: int | None = None,
        *,
        fresh: bool = False,
        decision_ids: Sequence[str] | None = None,
    ) -> ModerationResponse:
        """One result per image; text only: one per string of a list of strings, else one for the text.
        ``record`` is filled in for the request's telemetry (recorded by the caller, once)."""
        started = time.monotonic()
        request_id = record.request_id
        options = request.modgate
        images, texts = split_input(request)
        context = RequestContext(
            tenant=caller.tenant,
            requested=options.thinking if options and options.thinking else requested,
            tags=tuple(options.tags) if options else (),
            priority=options.priority if options else 0,
            requested_format=options.verdict_format if options else None,
        )
        policy = self.policies.current()
        moderation = policy.moderation.for_tenant(caller.tenant)
        decision = decide(policy, context, under_load=self.load.update(policy.load))
        if decision.escalation is not None and moderation.review_below > decision.escalation.threshold:
            # escalate: a verdict the tenant would send to review is first asked again with thinking on
            raised = decision.escalation.model_copy(update={"threshold": moderation.review_below})
            decision = replace(decision, escalation=raised)
        shaping_started = time.monotonic()
        with self.tracer.start_as_current_span("shaping", attributes={"modgate.images": len(images)}):
            # all bad input fails before any engine call
            identity, lone, busy = self.needs_identity(len(images)), len(images) == 1, self.in_flight > 1
            shaped = await together(
                *(self.shape(one, caller.tenant, identity=identity, lone=lone, busy=busy) for one in images)
            )
        shaping_s = (time.monotonic() - shaping_started) / max(1, len(shaped))
        record.shaping_s, record.shaped = shaping_s, len(shaped)
        extra_text = "\n".join(texts)
        if shaped:
            k = packing or self.settings.shaping.packing_k
            try:
                outcomes = await self._judge_frames(
                    list(shaped), extra_text, decision, context, request_id, k, fresh=fresh
                )
            except ENGINE_FAILURES as exc:
                if moderation.on_engine_failure == "fail_closed":
                    raise
                outcomes = [
                    engine_failure_outcome(exc, decision, f"{request_id}-{i}") for i in range(len(shaped))
                ]
            if self.shadow is not None and not extra_text:
                video_id = options.video_id if options else None
                for judged_frame, outcome in zip(shaped, outcomes, strict=True):
                    if outcome.engine_failure is not None:
                        continue  # nothing was judged
                    if decision.mode == "escalate":
                        self._pair_escalation(policy, judged_frame, outcome, caller.tenant, video_id)
                    elif outcome.reused is None and outcome.packed == 1:  # a verdict on this frame alone
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
            try:
                outcomes = list(await asyncio.gather(*(
                    self.judge.judge(
                        [], text_template.format(text=piece), decision, context, f"{request_id}-{index}"
                    )
                    for index, piece in enumerate(pieces)
                )))
            except ENGINE_FAILURES as exc:
                if moderation.on_engine_failure == "fail_closed":
                    raise
                outcomes = [
                    engine_failure_outcome(exc, decision, f"{request_id}-{i}") for i in range(len(pieces))
                ]
        outcomes = [under_moderation_policy(outcome, moderation) for outcome in outcomes]
        results = []
        for index, outcome in enumerate(outcomes):
            frame = shaped[index] if shaped else None
            latency_s = time.monotonic() - started
            provenance = self._provenance(outcome, policy)
            results.append(
                moderation_result(outcome, frame, latency_s, shaping_s if frame else 0.0, provenance,
                                  captioned=bool(extra_text))
            )
            if decision_ids is not None:
                results[-1].modgate.decision_id = decision_ids[index]
            record.results.append(results[-1].modgate)
        decided_at = datetime.now(UTC)
        queued: list[ReviewItem | None] = [None] * len(results)
        if self.review is not None and shaped:  # first: each decision's row names the stratum it went to
            queued = await self.review.offer_judged(
                caller, list(shaped), outcomes, results, moderation, moderation_request_id=request_id
            )
        await self.decisions.append(
            decision_row(result.modgate, request_id, caller.tenant, decided_at, item)
            for result, item in zip(results, queued, strict=True)
        )
        return ModerationResponse(
            id=request_id, model=request.model or self.settings.server.model_name, results=results
        )

    def _provenance(self, outcome: FrameOutcome, policy: ThinkingPolicy) -> Provenance:
        """What produced ``outcome``: the model of the engine that answered (a reused verdict's: the model
        in force, as reuse is scoped by it), the system prompt's version, the policy document's version."""
        model = self.identity.models.get(outcome.answer.engine) or self.identity.model
        prompt = self.system_prompts[outcome.decision.verdict_format]
        return Provenance(
            model=model.id if model else None,
            model_revision=(model.revision or None) if model else None,
            prompt_version=prompt.version,
            prompt_sha256=prompt.sha256,
            moderation_policy_version=policy.version,
        )

    def _pair_escalation(
        self, policy: ThinkingPolicy, frame: ShapedImage, outcome: FrameOutcome, tenant: str,
        video_id: str | None,
    ) -> None:
        """Quality records of an escalate-mode frame: every escalation is a pair, and a random share too.

        The shadow coin is drawn for every frame, escalated or not, so the pairs it picks stay a random
        sample of all frames (``selection: random``); an escalation it did not pick is marked
        ``escalation``: the report weighs those by their chance of being paired (1) or leaves them out.
        """
        assert self.shadow is not None
        drawn = self.shadow.draw(policy)
        verdict_format = outcome.decision.verdict_format
        if outcome.fast is not None:
            self.shadow.record_pair(
                policy.version, frame, (outcome.fast.verdict, outcome.fast.answer),
                (outcome.verdict, outcome.answer), tenant=tenant, video_id=video_id,
                selection="random" if drawn else "escalation", probability=1.0,
                verdict_format=verdict_format,
            )
        elif drawn and outcome.reused is None and outcome.packed == 1:
            self.shadow.consider(policy, frame, "off", outcome.verdict, outcome.answer, tenant=tenant,
                                 video_id=video_id, verdict_format=verdict_format, drawn=True)

    def _instruction(self, frames: int, extra_text: str) -> str:
        """The user text of an engine request judging ``frames`` keyframes (plus any caller text)."""
        shaping = self.settings.shaping
        base = shaping.user_text if frames == 1 else shaping.packed_user_text.format(frames=frames)
        return base + (f"\n{extra_text}" if extra_text else "")

    async def _reusable(self, scopes: list[VerdictScope], frame: FrameIdentity) -> ReusedVerdict | None:
        """The best verdict stored for ``frame`` under any of ``scopes``."""
        return await self.verdicts.lookup_any(scopes, frame)

    async def _riding_lookup(
        self, scopes: list[VerdictScope], frames: list[ShapedImage], identities: list[FrameIdentity],
        extra_text: str, decision: ThinkingDecision,
    ) -> RidingLookup | None:
        """The lookup of a lone frame as Lua riding with its engine lease's acquire (one round trip for
        both), when the verdict cache and the leases share a Redis that answers; else None. Not while the
        request's prompt tokens are still to be measured: a frame the cache answers must not cost the
        engine a ``/tokenize`` (the engine request is prepared before the lease is asked)."""
        if len(identities) != 1:
            return None
        riding = self.verdicts.lookup_rider(scopes, identities[0])
        if riding is None or not self.engines.can_carry(riding.rider):
            return None
        measured = await self.judge.tokens.measured(
            frames, self._instruction(1, extra_text), decision.mode == "on", decision.verdict_format
        )
        return riding if measured else None

    async def _judge_riding(
        self,
        riding: RidingLookup,
        frame: ShapedImage,
        extra_text: str,
        decision: ThinkingDecision,
        context: RequestContext,
        request_id: str,
        keep: Callable[[FrameOutcome], LeaseRider | None] | None,
    ) -> FrameOutcome | ReusedVerdict | None:
        """A lone frame judged with its lookup riding on the lease's acquire: the engine's outcome, or the
        verdict the lookup found (None: it found near candidates none of which passes, or it could not ride
        and the lookup alone found nothing: the frame is judged as any other then)."""
        try:
            return await self.judge.judge(
                [frame], self._instruction(1, extra_text), decision, context, f"{request_id}-0",
                first=riding.rider, keep=keep,
            )
        except SlotWithheld:
            if riding.rider.ran:
                return riding.hit()
            return await self._reusable(list(riding.scopes), riding.frame)
        finally:
            if riding.rider.error is not None:  # Redis failed: a miss, as a failed lookup alone is
                lookup_failed(riding.rider.error)

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

        A frame the verdict cache answers, or that repeats an earlier frame of this request, reuses that
        verdict (``frame_reuse``). The others go to the engine ``packing`` to a request (all of one caller,
        so one tenant); their fresh verdicts are kept for reuse.
        """
        storing = self.keeps_verdicts
        # Each engine's scope (its model's), in the pool's order: a verdict is kept under the scope of the
        # engine that made it and looked up under every engine's the request could go to (frame_reuse).
        # Without the verdict cache nothing is looked up or kept: no scope is made.
        prompt_sha256 = self.system_prompts[decision.verdict_format].sha256
        scopes = {
            url: verdict_scope(context.tenant, decision, extra_text, prompt_sha256, model_scope)
            for url, model_scope in (await self.identity.scopes()).items()
        } if storing else {}
        searched = list(dict.fromkeys(scopes.values()))  # engines serving the same model share one
        reuse_decision = decision
        if decision.reask is not None:  # escalate: what a reused thinking-on verdict answers under
            reuse_decision = replace(decision.reask, rule=decision.rule)
        rule = self.verdicts.rule
        identities = frame_identities(frames, rule)
        kept_by: dict[int, LeaseRider] = {}  # a leader's verdict sent with its engine lease's release

        def keeper(chunk: list[int]) -> Callable[[FrameOutcome], LeaseRider | None] | None:
            """What a chunk's engine call sends with its lease's release: its fresh verdicts (escalate keeps
            its verdicts once the re-asks are done, below)."""
            if not storing or decision.mode == "escalate":
                return None

            def keep(outcome: FrameOutcome) -> LeaseRider | None:
                shares: list[FrameOutcome | None] = [None] * len(frames)
                for position, index in enumerate(chunk):
                    shares[index] = packed_share(outcome, position)
                rider = self.verdicts.store_rider(
                    verdicts_to_keep(scopes, chunk, shares, identities, time.time())
                )
                if rider is not None:
                    kept_by.update(dict.fromkeys(chunk, rider))
                return rider

            return keep

        hits: list[ReusedVerdict | None] = [None] * len(frames)
        prejudged: FrameOutcome | None = None  # a lone frame judged with its lookup riding on the lease
        if storing and not fresh:
            riding = await self._riding_lookup(searched, frames, identities, extra_text, decision)
            if riding is None:
                hits = list(await asyncio.gather(*(self._reusable(searched, frame) for frame in identities)))
            else:
                found = await self._judge_riding(
                    riding, frames[0], extra_text, decision, context, request_id, keeper([0])
                )
                if isinstance(found, FrameOutcome):
                    prejudged = found
                else:
                    hits = [found]
        outcomes: list[FrameOutcome | None] = [None] * len(frames)
        for index, hit in enumerate(hits):
            if hit is not None:
                stored = hit.stored
                outcomes[index] = replace(
                    reused_outcome(stored.verdict(), hit.reused, reuse_decision, stored.request_id),
                    thinking_mode=decision.mode,
                )
        plan = plan_frames(identities, hits, rule)
        leaders = plan.leaders
        chunks = [leaders[start : start + packing] for start in range(0, len(leaders), packing)]
        judged = [prejudged] if prejudged is not None else await together(
            *(
                self.judge.judge(
                    [frames[i] for i in chunk],
                    self._instruction(len(chunk), extra_text),
                    decision,
                    context,
                    f"{request_id}-{chunk[0]}",
                    keep=keeper(chunk),
                )
                for chunk in chunks
            )
        )
        for chunk, outcome in zip(chunks, judged, strict=True):
            for position, index in enumerate(chunk):
                outcomes[index] = packed_share(outcome, position)
        if decision.mode == "escalate":
            one_frame = self._instruction(1, extra_text)
            escalated = await asyncio.gather(*(
                self.escalation.answer(
                    frames[i], outcomes[i], one_frame, decision, context, f"{request_id}-{i}"
                )
                for i in leaders
            ))
            for index, final in zip(leaders, escalated, strict=True):
                outcomes[index] = final
        for index, (leader, how) in plan.followers.items():
            made = outcomes[leader]
            assert made is not None  # leaders were all judged above
            outcomes[index] = replace(
                reused_outcome(made.verdict, how, made.decision, made.answer.request_id),
                thinking_mode=made.thinking_mode,
            )
        if storing:
            for rider in {id(rider): rider for rider in kept_by.values()}.values():
                if rider.error is not None:
                    store_failed(rider.error)
            alone = [index for index in leaders if index not in kept_by or not kept_by[index].ran]
            await self.verdicts.store_all(verdicts_to_keep(scopes, alone, outcomes, identities, time.time()))
        return [outcome for outcome in outcomes if outcome is not None]
