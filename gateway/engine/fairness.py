"""Fair shares between tenants, counted in work: virtual counters in the manner of VTC.

Each tenant (a *flow*) has a counter of the work it has been served, divided by its weight. Whoever picks
the next waiter (the admission queue for engine slots, the shaping pool for its threads) takes it from the
backlogged flow with the lowest counter, and charges that flow the work. Two rules make the share fair:

- work, not turns: a thinking-on keyframe decodes ~95 tokens and a thinking-off one a few, so a share counted
  in requests (llm-d's per-flow round robin) would give a thinking-on tenant many times the engine time of a
  thinking-off one. The engine slots are charged an estimate of engine time in prompt-token equivalents
  (:class:`WorkModel`), corrected with the call's real usage when it ends; the shaping threads are charged
  the seconds each task ran.
- no banking: a flow that was idle comes back at the lowest counter among the flows still waiting (or at
  the last counter served, when nobody waits), never below. An idle tenant leaves its share to the others
  meanwhile, and cannot come back with a burst that starves them.

Ties go to the flow with fewer calls under way, then to the one that has waited longest: a quiet tenant
whose counter was just lifted to a busy tenant's level is served before the busy tenant's next call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

Fairness = Literal["tenant", "fifo"]
"""``tenant``: each tenant its weighted share of work; ``fifo``: one shared queue (priority, then arrival)."""

SHARED_FLOW: Final = ""
"""The one flow every request belongs to under ``fifo``; also untagged background work of the shaping pool."""

Weight = Callable[[str], float]


class FairShare:
    """Virtual work counters per flow: who is served next, and what each has been charged."""

    def __init__(self, weight: Weight) -> None:
        self.weight = weight
        self.counters: dict[str, float] = {}
        self.served: dict[str, float] = {}  # raw work charged per flow (not divided by its weight)
        self._floor = 0.0  # the counter of the last flow served: where an idle flow comes back

    def _weight(self, flow: str) -> float:
        return max(1e-6, self.weight(flow))

    def arrive(self, flow: str, backlogged: Iterable[str]) -> None:
        """``flow`` starts waiting: lift its counter to the lowest waiting one (no credit saved idle)."""
        others = [self.counters.get(other, 0.0) for other in backlogged if other != flow]
        floor = min(others) if others else self._floor
        self.counters[flow] = max(self.counters.get(flow, floor), floor)

    def pick(self, candidates: Iterable[str], tiebreak: Callable[[str], tuple[float, ...]]) -> str:
        """The backlogged flow served next: lowest counter, then ``tiebreak`` (lower first)."""
        return min(candidates, key=lambda flow: (self.counters.get(flow, self._floor), *tiebreak(flow)))

    def snapshot(self, flow: str) -> tuple[float | None, float | None, float]:
        """``flow``'s counter and served work and the floor, as they are now (for :meth:`restore`)."""
        return self.counters.get(flow), self.served.get(flow), self._floor

    def restore(self, flow: str, snapshot: tuple[float | None, float | None, float]) -> None:
        """Put ``flow``'s figures and the floor back as :meth:`snapshot` found them."""
        counter, served, self._floor = snapshot
        for figures, value in ((self.counters, counter), (self.served, served)):
            if value is None:
                figures.pop(flow, None)
            else:
                figures[flow] = value

    def charge(self, flow: str, work: float) -> None:
        """``flow`` was served ``work`` (negative: a correction after an over-estimate)."""
        counter = self.counters.get(flow, self._floor)
        if work > 0:
            self._floor = max(self._floor, counter)
        self.counters[flow] = counter + work / self._weight(flow)
        self.served[flow] = self.served.get(flow, 0.0) + work


@dataclass(frozen=True, slots=True)
class Work:
    """What one engine call is expected to cost, for the tenant that asks it (prompt-token equivalents)."""

    tenant: str
    cost: float
    thinking: bool = False


class WorkModel:
    """Engine time of a call in prompt-token equivalents: prompt tokens + weight × output tokens.

    The weight prices one output token against one prompt token: the engine's prefill rate over its
    aggregate decode rate (docs/tenants.md). Set (``MODGATE_TENANTS__OUTPUT_TOKEN_WEIGHT``, or the built-in
    simulator's preset) it stays; otherwise it starts at the default and is learned from the engine served
    (:meth:`observe`). Output is unknown until the call ends, so the estimate uses the mean output of recent
    calls in the same thinking mode; the real usage then corrects the charge.
    """

    def __init__(
        self, output_token_weight: float, prompt_tokens: float = 1076.0, *, learn_weight: bool = False
    ) -> None:
        self.output_token_weight = output_token_weight
        self.learn_weight = learn_weight
        self.weight_samples = 0  # calls the weight was learned from
        self._prompt_per_frame = prompt_tokens
        self._output = {True: 95.0, False: 10.0}  # starting guesses; moved by every call's real usage

    def estimate(self, tenant: str, frames: int, thinking: bool, prompt_tokens: int | None = None) -> Work:
        """The expected work of a call judging ``frames`` keyframes (``prompt_tokens`` if predicted)."""
        frames = max(1, frames)
        prompt = float(prompt_tokens) if prompt_tokens is not None else self._prompt_per_frame * frames
        return Work(tenant, prompt + self.output_token_weight * self._output[thinking] * frames, thinking)

    def actual(self, work: Work, frames: int, prompt_tokens: int, completion_tokens: int) -> float:
        """The real work of a finished call; learns the mean output and prompt per frame from it."""
        frames = max(1, frames)
        self._output[work.thinking] = 0.9 * self._output[work.thinking] + 0.1 * completion_tokens / frames
        self._prompt_per_frame = 0.9 * self._prompt_per_frame + 0.1 * prompt_tokens / frames
        return prompt_tokens + self.output_token_weight * completion_tokens

    def observe(
        self, prefilled_tokens: int, ttft_s: float | None, output_tokens: int, decode_s: float, streams: float
    ) -> None:
        """Learn the weight from one finished call (when it is not set): the engine time of an output token
        over a prompt token's. A prompt token took ``ttft_s / prefilled_tokens`` (the prefill holds the
        engine); an output token ``decode_s / (output_tokens - 1)`` of the call's own time, shared by the
        ``streams`` calls decoding beside it on that engine (a decode step serves them all: what one costs
        the engine is its share, the aggregate decode rate's). Calls too short to time are skipped."""
        if not self.learn_weight or ttft_s is None or ttft_s <= 0 or decode_s <= 0:
            return
        if prefilled_tokens < MIN_TIMED_TOKENS or output_tokens - 1 < MIN_TIMED_TOKENS:
            return
        per_prompt_token = ttft_s / prefilled_tokens
        per_output_token = decode_s / (output_tokens - 1) / max(1.0, streams)
        weight = min(1000.0, per_output_token / per_prompt_token)
        self.weight_samples += 1
        alpha = max(0.1, 1.0 / self.weight_samples)  # the first calls replace the default, then a mean
        self.output_token_weight = (1 - alpha) * self.output_token_weight + alpha * weight


MIN_TIMED_TOKENS: Final = 8
"""Fewer prompt or output tokens than this time the request's fixed costs, not the engine's per token."""
