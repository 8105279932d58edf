"""Shadow pairs for the quality module: the same shaped frame judged again in the other thinking mode.

For the policy's ``shadow_share`` of live frames, the gateway asks the engine once more with the opposite
thinking mode, at the lowest priority and only on spare capacity: a free slot with nobody waiting. It never
delays a live request and never passes the in-flight cap; when there is no spare slot the pair is skipped
(and counted), not queued. Both verdicts are written as :class:`quality.records.VerdictRecord`s, so a
weekly report covers live traffic across restarts.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from gateway.engine.client import EngineAnswer
from gateway.engine.pool import EnginePool
from gateway.errors import ModgateError
from gateway.policy.rules import Mode, ThinkingPolicy
from quality.records import Arm, RecordStore, VerdictRecord, arm_for
from shaping.confidence import with_confidence
from shaping.image import ShapedImage
from shaping.prompt import RequestOptions, SystemPrompt, build_chat_request
from shaping.verdict import KeyframeVerdict, VerdictFormat, parse_engine_output

log = logging.getLogger("modgate.shadow")

LOWEST_PRIORITY = 10  # the bottom of the request priority range: shadow work yields to everything


class ShadowCounters(Protocol):
    """Where the sampler counts what it did (the gateway's metrics)."""

    def shadow(self, outcome: str) -> None: ...


def arm_of(mode: Mode, verdict_format: VerdictFormat = "compact") -> Arm:
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
    ) -> None:
        self.engines = engines
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

    def consider(
        self,
        policy: ThinkingPolicy,
        frame: ShapedImage,
        live_mode: Mode,
        live_verdict: KeyframeVerdict,
        live_answer: EngineAnswer,
        *,
        tenant: str,
        video_id: str | None,
        verdict_format: VerdictFormat = "compact",
    ) -> bool:
        """Maybe start a shadow judgement of ``frame`` (in the live verdict's format); answers whether one was
        started."""
        if policy.shadow_share <= 0 or self._rng.random() >= policy.shadow_share:
            return False
        if not self.engines.has_spare_capacity():
            self._count("skipped_busy")
            return False
        live = self._record(
            frame, live_mode, verdict_format, live_verdict, live_answer, policy.version, tenant, video_id
        )
        other: Mode = "off" if live_mode == "on" else "on"
        task = asyncio.get_running_loop().create_task(
            self._run(policy, frame, other, verdict_format, live, tenant, video_id)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _run(
        self,
        policy: ThinkingPolicy,
        frame: ShapedImage,
        mode: Mode,
        verdict_format: VerdictFormat,
        live: VerdictRecord,
        tenant: str,
        video_id: str | None,
    ) -> None:
        body = build_chat_request(
            self.system_prompts[verdict_format],
            [frame],
            self.user_text,
            RequestOptions(
                model=await self.model(),
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
            async with self.engines.spare_slot() as held:
                if held is None:  # live work took the slot since consider(): skip, never wait
                    self._count("skipped_busy")
                    return
                answer = await held.chat(body, f"shadow-{uuid.uuid4().hex}")
        except ModgateError as exc:
            self._count("engine_error")
            log.warning("shadow judgement failed: %s", exc.message)
            return
        parsed = parse_engine_output(answer.content, answer.reasoning, answer.finish_reason)
        verdict = with_confidence(parsed.verdicts, answer.logprobs, answer.content)[0]
        shadow = self._record(frame, mode, verdict_format, verdict, answer, policy.version, tenant, video_id)
        try:
            await self.store.append(live)
            await self.store.append(shadow)
        except Exception:  # a store outage must not take the gateway down: the pair is lost, and counted
            self._count("store_error")
            log.exception("could not store a shadow pair")
            return
        self._count("recorded")

    def _record(
        self,
        frame: ShapedImage,
        mode: Mode,
        verdict_format: VerdictFormat,
        verdict: KeyframeVerdict,
        answer: EngineAnswer,
        policy_version: int,
        tenant: str,
        video_id: str | None,
    ) -> VerdictRecord:
        usage = answer.usage
        return VerdictRecord(
            frame_sha256=frame.sha256,
            video_id=video_id,
            tenant=tenant,
            arm=arm_of(mode, verdict_format),
            action=verdict.action,
            confidence=verdict.confidence,
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
        )

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Wait for shadow judgements in flight (bounded)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
