"""The prompt tokens an engine request should cost, predicted before the call and checked after (issue 4)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from gateway.engine.answers import EngineAnswer
from gateway.engine.pool import EnginePool
from gateway.errors import ModgateError
from gateway.series.metrics import GatewayMetrics
from gateway.telemetry.recorder import VerdictRecorder
from shaping.accounting import PromptPrediction, TokenAccountant, compare_usage
from shaping.image import ShapedImage
from shaping.prompt import SystemPrompt
from shaping.verdict import VerdictFormat

log = logging.getLogger("modgate.moderation")


class PromptTokenCheck:
    """Predicts each engine request's prompt tokens and counts the requests the engine counted otherwise."""

    def __init__(
        self,
        system_prompts: Mapping[VerdictFormat, SystemPrompt],
        engines: EnginePool,
        engine_model: Callable[[], Awaitable[str]],
        metrics: GatewayMetrics,
        model_ids: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.system_prompts = system_prompts
        self.engines = engines
        self.engine_model = engine_model
        self.model_ids = model_ids  # each engine's own model id by URL: what its /tokenize is asked under
        self.figures = VerdictRecorder(metrics)
        # one per system prompt and served model, built with its first request: each format's prompt counts
        # its own tokens, and an engine that comes back with other weights is measured afresh
        self.accountants: dict[tuple[VerdictFormat, str], TokenAccountant] = {}
        self._lock = asyncio.Lock()
        self._paused_until = 0.0  # after a failed /tokenize: no prediction until then
        self._said_off: set[str] = set()  # engines already named as unable to count image tokens

    async def images_countable(self) -> bool:
        """Whether every engine counts an image's tokens; an engine that cannot (llama.cpp: its ``/tokenize``
        takes text, its usage has no image count) switches prediction off for requests with images, said
        once per engine (at start for the engines detected then), while text-only ones are still predicted."""
        blind = self.engines.engines_counting_no_images()
        for url in blind:
            if url not in self._said_off:
                self._said_off.add(url)
                log.warning(
                    "token prediction is off for requests with images: the engine at %s counts no image "
                    "tokens (llama.cpp's /tokenize takes text only); text-only requests are still predicted",
                    url,
                )
        return not blind

    async def predict(
        self,
        frames: list[ShapedImage],
        user_text: str,
        enable_thinking: bool,
        verdict_format: VerdictFormat,
    ) -> PromptPrediction | None:
        """The prompt tokens this engine request should cost; what the accountant lacks is asked of /tokenize.

        A failing /tokenize never fails a moderation: prediction pauses for a minute, the request goes on.
        None for a request with images while an engine cannot count them (:meth:`images_countable`).
        """
        if time.monotonic() < self._paused_until or (frames and not await self.images_countable()):
            return None
        model = await self.engine_model()
        accountant = self.accountants.get((verdict_format, model))
        if accountant is None:
            accountant = TokenAccountant(self.system_prompts[verdict_format].text, model)
            self.accountants[verdict_format, model] = accountant
        if accountant.pending(enable_thinking, user_text, frames):
            async with self._lock:  # concurrent first requests measure once
                if time.monotonic() < self._paused_until:  # the one before us failed: do not ask again
                    return None
                try:
                    for _ in range(3):  # the image overhead is measured after the scaffold it is relative to
                        for measurement in accountant.pending(enable_thinking, user_text, frames):
                            counted = await self.engines.tokenize(measurement.body, models=self.model_ids())
                            accountant.record(measurement, counted)
                except (ModgateError, KeyError, ValueError, TypeError) as exc:
                    self._paused_until = time.monotonic() + 60.0
                    log.warning("token prediction paused for 60 s: engine /tokenize failed: %s", exc)
                    return None
        return accountant.predict(enable_thinking, user_text, frames)

    async def measured(
        self, frames: list[ShapedImage], user_text: str, enable_thinking: bool, verdict_format: VerdictFormat
    ) -> bool:
        """Whether :meth:`predict` would ask the engine nothing for this request (all it needs is measured,
        or prediction is paused): what a request whose engine call may not happen needs."""
        if time.monotonic() < self._paused_until or (frames and not await self.images_countable()):
            return True
        accountant = self.accountants.get((verdict_format, await self.engine_model()))
        return accountant is not None and not accountant.pending(enable_thinking, user_text, frames)

    def check(self, prediction: PromptPrediction | None, answer: EngineAnswer, request_id: str) -> None:
        """Count and log a request whose prompt tokens (or image tokens) the engine counted differently."""
        if prediction is None:
            return
        if answer.usage.prompt_tokens:  # an engine without usage gives nothing to compare with
            self.figures.prediction_compared()
        mismatch = compare_usage(prediction, answer.usage.prompt_tokens, answer.usage.image_tokens or 0)
        if mismatch is not None:
            self.figures.prediction_missed()
            log.warning(
                "token prediction mismatch: %s", mismatch.describe(), extra={"request_id": request_id}
            )
