"""Shadow pairs for the quality module: the same shaped frame judged again in the other thinking mode.

For the policy's ``shadow_share`` of live frames, the gateway asks the engine once more with the opposite
thinking mode, at the lowest priority and only on spare capacity: a free slot with nobody waiting. It never
delays a live request and never passes the in-flight cap; when there is no spare slot the pair is skipped
(and counted), not queued. Both verdicts are written as :class:`contracts.records.VerdictRecord`s, so a
weekly report covers live traffic across restarts.

With a second engine (``MODGATE_SHADOW__ENGINE_URL``, a :class:`SecondEngine`), the same drawn frames are
also judged there in the live thinking mode and verdict format, on its spare capacity: each record
carries the kind of engine that judged it (``engine``), so one engine's verdicts pair with the other's.
The live verdict is written once, with whichever shadow verdicts came back.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from contracts.records import Arm, RecordStore, Selection, VerdictRecord, arm_for
from gateway.engine.answers import EngineAnswer
from gateway.engine.pool import EnginePool
from gateway.errors import ModgateError
from gateway.policy.rules import EngineMode, ThinkingPolicy
from shaping.confidence import with_confidence
from shaping.image import ShapedImage
from shaping.prompt import RequestOptions, SystemPrompt, build_chat_request
from shaping.verdict import KeyframeVerdict, VerdictFormat, parse_engine_output

log = logging.getLogger("modgate.shadow")

LOWEST_PRIORITY = 10  # the bottom of the request priority range: shadow work yields to everything


# Each engine's own model id by URL (EngineIdentity.model_ids): what its requests name (a pool of both kinds).
ModelIds = Callable[[], Mapping[str, str]]


# One shadow judgement to make: in which mode, on which engines, of which kind (until the engine that answers
# is detected), asking for which model (the body's, and each engine's own).
_Judge = tuple[EngineMode, EnginePool, str, Callable[[], Awaitable[str]], ModelIds]


@dataclass(frozen=True)
class SecondEngine:
    """Another engine that judges the shadow share in the live mode and format (its own pool and model)."""

    engines: EnginePool
    kind: str  # recorded as VerdictRecord.engine (vllm or llamacpp) until the engine's own kind is detected
    model: Callable[[], Awaitable[str]]
    model_ids: ModelIds = dict


class ShadowCounters(Protocol):
    """Where the sampler counts what it did (the recorder's ``VerdictRecorder``)."""

    def shadow(self, outcome: str) -> None: ...


def arm_of(mode: EngineMode, verdict_format: VerdictFormat = "compact") -> Arm:
    """The quality arm name of a thinking mode and verdict format."""
    return arm_for(mode, verdict_format)


class ShadowSampler:
    """Schedules and runs shadow judgements; ``drain()`` waits for the ones in flight (shutdown, tests)."""

    def __init__(
        self,
        *,
        engines: EnginePool,
        store: RecordStore,
        system_prompts: Mapping[VerdictFormat, SystemPrompt],
        user_text: str,
        model: Callable[[], Awaitable[str]],
        use_priority: bool,
        constraint: str,
        top_logprobs: int = 0,
        counters: ShadowCounters | None = None,
        rng: random.Random | None = None,
        engine_kind: str = "vllm",
        second: SecondEngine | None = None,
        model_ids: ModelIds = dict,
    ) -> None:
        self.engines = engines
        # the live engines' kind, recorded with their verdicts when the answering engine's is not yet detected
        self.engine_kind = engine_kind
        self.model_ids = model_ids
        self.second = second
        self.store = store
        self.system_prompts = dict(system_prompts)
        self.top_logprobs = top_logprobs
        self.user_text = user_text
        self.model = model
        self.use_priority = use_priority
        self.constraint = constraint
        self.counters = counters
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()

    def _count(self, outcome: str) -> None:
        if self.counters is not None:
            self.counters.shadow(outcome)

    def draw(self, policy: ThinkingPolicy) -> bool:
        """The shadow coin: whether this frame is one of the policy's random ``shadow_share``."""
        return policy.shadow_share > 0 and self._rng.random() < policy.shadow_share

    def consider(
        self,
        policy: ThinkingPolicy,
        frame: ShapedImage,
        live_mode: EngineMode,
        live_verdict: KeyframeVerdict,
        live_answer: EngineAnswer,
        *,
        tenant: str,
        video_id: str | None,
        verdict_format: VerdictFormat = "compact",
        drawn: bool = False,
    ) -> bool:
        """Maybe start a shadow judgement of ``frame`` (in the live verdict's format); answers whether one was
        started. ``drawn``: the caller already drew the shadow coin (:meth:`draw`) and it fell.
        """
        if not (drawn or self.draw(policy)):
            return False
        other: EngineMode = "off" if live_mode == "on" else "on"
        judges: list[_Judge] = []
        if self.engines.has_spare_capacity():
            judges.append((other, self.engines, self.engine_kind, self.model, self.model_ids))
        else:
            self._count("skipped_busy")
        second = self.second
        if second is not None:
            if second.engines.has_spare_capacity():
                judges.append((live_mode, second.engines, second.kind, second.model, second.model_ids))
            else:
                self._count("second_engine_skipped_busy")
        if not judges:
            return False
        live = self._record(frame, live_mode, verdict_format, live_verdict, live_answer, policy.version,
                            tenant, video_id, ("random", policy.shadow_share), self._live_kind(live_answer))
        task = asyncio.get_running_loop().create_task(
            self._judge_all(policy, frame, judges, verdict_format, live, tenant, video_id)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def record_pair(
        self,
        policy_version: int,
        frame: ShapedImage,
        fast: tuple[KeyframeVerdict, EngineAnswer],
        thinking: tuple[KeyframeVerdict, EngineAnswer],
        *,
        tenant: str,
        video_id: str | None,
        selection: Selection,
        probability: float,
        verdict_format: VerdictFormat = "compact",
    ) -> None:
        """Store a thinking off/on pair the live path already made (an escalation), in the background."""
        marks = (selection, probability)
        records = (
            self._record(frame, "off", verdict_format, *fast, policy_version, tenant, video_id, marks,
                         self._live_kind(fast[1])),
            self._record(frame, "on", verdict_format, *thinking, policy_version, tenant, video_id, marks,
                         self._live_kind(thinking[1])),
        )
        task = asyncio.get_running_loop().create_task(self._store(records))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, records: tuple[VerdictRecord, ...]) -> None:
        try:
            for record in records:
                await self.store.append(record)
        except Exception:  # a store outage must not take the gateway down: the pair is lost, and counted
            self._count("store_error")
            log.exception("could not store a shadow pair")
            return
        self._count("recorded")

    async def _judge_all(
        self,
        policy: ThinkingPolicy,
        frame: ShapedImage,
        judges: list[_Judge],
        verdict_format: VerdictFormat,
        live: VerdictRecord,
        tenant: str,
        video_id: str | None,
    ) -> None:
        """Every shadow judgement of one frame at once; the live record is stored with those that return."""
        judged = await asyncio.gather(*(
            self._judge(policy, frame, verdict_format, *judge, tenant, video_id) for judge in judges
        ))
        shadows = tuple(record for record in judged if record is not None)
        if shadows:
            await self._store((live, *shadows))

    async def _judge(
        self,
        policy: ThinkingPolicy,
        frame: ShapedImage,
        verdict_format: VerdictFormat,
        mode: EngineMode,
        engines: EnginePool,
        kind: str,
        model: Callable[[], Awaitable[str]],
        model_ids: ModelIds,
        tenant: str,
        video_id: str | None,
    ) -> VerdictRecord | None:
        try:
            model_id = await model()
        except ModgateError as exc:
            self._count("engine_error")
            log.warning("shadow judgement failed: %s", exc.message)
            return None
        body = build_chat_request(
            self.system_prompts[verdict_format],
            [frame],
            self.user_text,
            RequestOptions(
                model=model_id,
                enable_thinking=mode == "on",
                max_completion_tokens=(
                    policy.max_completion_tokens_on if mode == "on" else policy.max_completion_tokens_off
                ),
                constraint=self.constraint,
                priority=LOWEST_PRIORITY if self.use_priority else None,
                thinking_token_budget=policy.thinking_token_budget if mode == "on" else None,
                verdict_format=verdict_format,
                top_logprobs=self.top_logprobs,
            ),
        )
        try:
            async with engines.spare_slot() as held:
                if held is None:  # live work took the slot since consider(): skip, never wait
                    self._count("skipped_busy" if engines is self.engines else "second_engine_skipped_busy")
                    return None
                answer = await held.chat(body, f"shadow-{uuid.uuid4().hex}", models=model_ids())
        except ModgateError as exc:
            self._count("engine_error")
            log.warning("shadow judgement failed: %s", exc.message)
            return None
        parsed = parse_engine_output(answer.content, answer.reasoning, answer.finish_reason)
        verdict = with_confidence(
            parsed.verdicts, answer.logprobs, answer.content, grammar_masked=answer.logprobs_grammar_masked
        )[0]
        return self._record(frame, mode, verdict_format, verdict, answer, policy.version, tenant, video_id,
                            ("random", policy.shadow_share), engines.kind_of(answer.engine, kind))

    def _live_kind(self, answer: EngineAnswer) -> str:
        """The kind of the live engine that made ``answer`` (a pool may hold both kinds)."""
        return self.engines.kind_of(answer.engine, self.engine_kind)

    def _record(
        self,
        frame: ShapedImage,
        mode: EngineMode,
        verdict_format: VerdictFormat,
        verdict: KeyframeVerdict,
        answer: EngineAnswer,
        policy_version: int,
        tenant: str,
        video_id: str | None,
        selection: tuple[Selection, float],
        engine: str,
    ) -> VerdictRecord:
        usage = answer.usage
        return VerdictRecord(
            frame_sha256=frame.sha256,
            video_id=video_id,
            tenant=tenant,
            arm=arm_of(mode, verdict_format),
            action=verdict.action,
            flagged=verdict.flagged,
            categories=list(verdict.categories),
            policy_version=policy_version,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            latency_ms=round(answer.total_s * 1000, 2),
            ttft_ms=None if answer.ttft_s is None else round(answer.ttft_s * 1000, 2),
            recorded_at=datetime.now(UTC),
            source="shadow",
            request_id=answer.request_id,
            confidence=verdict.confidence if verdict.problem is None else None,
            selection=selection[0],
            selection_probability=selection[1],
            engine=engine,
        )

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Wait for shadow judgements in flight (bounded)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
