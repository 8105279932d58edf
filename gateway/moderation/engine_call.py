"""One engine call: build the chat request, admit it, stream the answer, parse a verdict per frame with its
confidence."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from gateway.engine.answers import EngineAnswer
from gateway.engine.calls import CallFigures
from gateway.engine.client import EngineClient
from gateway.engine.fairness import WorkModel
from gateway.engine.leases import LeaseRider
from gateway.engine.pool import EnginePool
from gateway.errors import ModgateError
from gateway.moderation.engine_identity import EngineIdentity
from gateway.moderation.outcome import FrameOutcome
from gateway.moderation.token_prediction import PromptTokenCheck
from gateway.policy.rules import QueueLoad, RequestContext, ThinkingDecision
from gateway.series.metrics import GatewayMetrics
from gateway.settings import EngineSettings
from gateway.telemetry.recorder import VerdictRecorder
from gateway.telemetry.tracing import engine_span_attributes
from shaping.confidence import answer_before_each, place_exact, probe_may_read, with_confidence
from shaping.image import ShapedImage
from shaping.prompt import RequestOptions, SystemPrompt, build_chat_request
from shaping.verdict import VerdictFormat, compact_regex, parse_engine_output

log = logging.getLogger("modgate.moderation")

REASK_PRIORITY = -100
"""Added to a request's priority for its escalation re-ask: below every request priority (-10..10), so a
frame already half answered goes ahead of new asks at admission (and in the engine, with ``use_priority``),
and re-asks keep their requests' order among themselves."""


def engine_options(
    decision: ThinkingDecision, frames: int, settings: EngineSettings, *, model: str, priority: int
) -> RequestOptions:
    """The engine request's options for ``frames`` packed keyframes asked under ``decision``: all that the
    policy puts into an engine request comes through here (``ThinkingDecision.engine_terms`` names it)."""
    return RequestOptions(
        model=model,
        enable_thinking=decision.mode == "on",
        # the policy's cap is per keyframe: K packed frames need K answers (and K times the thought)
        max_completion_tokens=decision.max_completion_tokens * max(1, frames),
        constraint=settings.verdict_constraint,
        stream=True,
        priority=priority if settings.use_priority else None,
        thinking_token_budget=(
            None
            if decision.thinking_token_budget is None
            else decision.thinking_token_budget * max(1, frames)
        ),
        verdict_format=decision.verdict_format,
        top_logprobs=settings.top_logprobs,
    )


@dataclass
class Places:
    """What the probes of one call read (frame index: the grammar's distribution) and what they cost."""

    found: dict[int, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


async def verdict_places(
    client: EngineClient, body: dict[str, Any], answer: EngineAnswer, decision: ThinkingDecision, frames: int,
    *, grammar: str | None, probes: int, request_id: str | None = None,
) -> Places:
    """For each compact thinking-off verdict the answer's own (not masked) list cannot give an exact
    confidence, the distribution at its first token from a probe held in the call's engine slot: at most
    ``probes`` calls a verdict (``MODGATE_ENGINE__PLACE_PROBES``), each drawn with another seed (a list is
    the grammar's only where the probe's first draw was one the grammar forbids: another seed, another
    draw), until one list reads exact. Their usage is counted, for the tenant's fair-share charge."""
    places = Places()
    if answer.logprobs_grammar_masked or answer.logprobs is None or decision.mode == "on" or probes <= 0:
        return places
    if decision.verdict_format != "compact" or grammar is None:
        return places
    frames = max(1, frames)
    parsed = parse_engine_output(answer.content, answer.reasoning, answer.finish_reason, frames=frames)
    read = with_confidence(
        parsed.verdicts, answer.logprobs, answer.content, grammar_masked=False, grammar=grammar
    )
    before = answer_before_each(answer.content)
    wanted = [i for i, v in enumerate(read) if probe_may_read(v) and i < len(before)]
    for i in wanted:  # one at a time: the probes share the call's one engine slot
        for seed in range(probes):
            place = await client.verdict_place(
                {**body, "seed": seed}, before[i], compact_regex(frames - i), request_id
            )
            if place is None:  # the wire cannot probe
                return places
            places.calls += 1
            places.prompt_tokens += place.usage.prompt_tokens
            places.completion_tokens += place.usage.completion_tokens
            if place.alternatives is not None and place_exact(place.alternatives, before[i], grammar):
                places.found[i] = place.alternatives
                break
    return places


class FrameJudge:
    """Asks the engine for the verdicts of up to K packed frames (or of a text) in one call."""

    def __init__(
        self,
        settings: EngineSettings,
        system_prompts: Mapping[VerdictFormat, SystemPrompt],
        engines: EnginePool,
        identity: EngineIdentity,
        tokens: PromptTokenCheck,
        work: WorkModel,
        load: QueueLoad,
        metrics: GatewayMetrics,
        tracer: trace.Tracer,
    ) -> None:
        self.settings = settings
        self.system_prompts = system_prompts
        self.engines = engines
        self.identity = identity
        self.tokens = tokens
        self.work = work  # engine work per call (fair share)
        self.load = load
        self.calls = CallFigures(metrics)  # what the call cost: the engine client's side counts it
        self.figures = VerdictRecorder(metrics)  # what the request's frames came to
        self.tracer = tracer
        # Told each answer's cached tokens (engine URL, verdict format, prompt, cached, monotonic send
        # time): the prefix keeper primes an engine again when they fall (gateway/engine/prefix_keeper.py).
        self.prefix_observer: Callable[[str, VerdictFormat, int, int, float], None] | None = None

    async def judge(
        self,
        frames: list[ShapedImage],
        user_text: str,
        decision: ThinkingDecision,
        context: RequestContext,
        request_id: str,
        *,
        reask: bool = False,
        first: LeaseRider | None = None,
        keep: Callable[[FrameOutcome], LeaseRider | None] | None = None,
    ) -> FrameOutcome:
        """One outcome for the call: the first frame's verdict, every frame's in ``verdicts``.

        ``first``: Lua sent with the engine lease's acquire (the verdict cache's lookup): the engine pool
        raises ``SlotWithheld`` when it found something or could not ride. ``keep``: what to send with the
        lease's release, made from the outcome (the verdict cache's store): the verdicts are parsed before
        the slot is given back, so they can go with it.
        """
        # a re-ask (escalation) goes ahead of new asks, at the admission queue and in the engine
        priority = context.priority + (REASK_PRIORITY if reask else 0)
        body = build_chat_request(
            self.system_prompts[decision.verdict_format],
            list(frames),
            user_text,
            engine_options(
                decision, len(frames), self.settings, model=(await self.identity.current()).id,
                priority=priority,
            ),
        )
        prediction = await self.tokens.predict(
            frames, user_text, decision.mode == "on", decision.verdict_format
        )
        work = self.work.estimate(
            context.tenant, len(frames), decision.mode == "on",
            None if prediction is None else prediction.total,
        )
        queued_at = time.time_ns()  # span times are wall-clock nanoseconds
        try:
            async with self.engines.slot(priority=priority, work=work, rider=first) as admission:
                self.tracer.start_span("queue", start_time=queued_at).end()
                self.calls.waited(admission.queue_seconds)
                self.load.observe_queue_wait(admission.queue_seconds)
                with self.tracer.start_as_current_span("engine") as engine_span:
                    sent_at = time.monotonic()
                    beside = admission.engine.inflight
                    answer = await admission.chat(body, request_id, models=self.identity.model_ids())
                    usage = answer.usage
                    self.work.observe(
                        usage.prompt_tokens - usage.cached_tokens, answer.ttft_s, usage.completion_tokens,
                        answer.total_s - (answer.ttft_s or 0.0), (beside + admission.engine.inflight) / 2,
                    )
                    if self.prefix_observer is not None:
                        self.prefix_observer(admission.engine.url, decision.verdict_format,
                                             usage.prompt_tokens, usage.cached_tokens, sent_at)
                    charged = self.work.actual(
                        work, len(frames), usage.prompt_tokens, usage.completion_tokens
                    )
                    admission.settle(charged)
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
                grammar = (await admission.engine.client.wire()).answer_grammar(body)
                places = await verdict_places(
                    admission.engine.client, body, answer, decision, len(frames),
                    grammar=grammar, probes=self.settings.place_probes, request_id=request_id,
                )
                if places.calls:  # the probes ran the model in this slot: the tenant's work too
                    charged += places.prompt_tokens + self.work.output_token_weight * places.completion_tokens
                    admission.settle(charged)
                outcome = self._read(
                    answer, frames, decision, admission.queue_seconds, request_id, places.found, grammar
                )
                if keep is not None:
                    admission.part_with(keep(outcome))
        except ModgateError as exc:
            self.calls.failed(type(exc).__name__)
            self.identity.forget()  # the engine may have restarted with other weights
            raise
        self.calls.answered(answer.ttft_s, answer.usage.prompt_tokens, answer.usage.cached_tokens)
        self.tokens.check(prediction, answer, request_id)
        return outcome

    def _read(
        self, answer: EngineAnswer, frames: list[ShapedImage], decision: ThinkingDecision, queue_s: float,
        request_id: str, places: Mapping[int, Sequence[tuple[str, float]]] | None = None,
        grammar: str | None = None,
    ) -> FrameOutcome:
        """The call's outcome: a verdict per frame parsed from the answer, each with its confidence."""
        top_logprobs = self.settings.top_logprobs
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
                grammar_masked=answer.logprobs_grammar_masked,
                grammar=grammar,
                places=places,
            )
        for problem in parsed.problems:
            self.calls.unusable(problem)
            log.warning("unusable engine output", extra={"request_id": request_id, "problem": problem})
        for judged in verdicts:
            self.figures.judged(judged.action, decision.mode == "on")
        return FrameOutcome(
            verdict=verdicts[0],
            answer=answer,
            decision=decision,
            queue_s=queue_s,
            verdicts=verdicts,
            packed=max(1, len(frames)),
        )
