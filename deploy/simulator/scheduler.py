"""The simulator's one scheduler interface: sequences, their events, and the loop that runs an engine's law.

An engine's scheduling law is two functions, ``plan_step`` (what the next step computes and how long it
lasts) and ``complete_step`` (the step has run: emit its tokens), plus how a request waits (``submit``).
``StepLoop`` holds everything else, the same for every engine: the asyncio loop that sleeps through each
step (times ``time_scale``), ``generate`` (a sequence's events as steps produce them; leaving early
aborts it), the counters ``/metrics`` shows, and the cost of one forward pass (``_step_seconds``: prefill
tokens at the preset's prefill rate, decode tokens at its decode rate, a cost per sequence in the pass,
plus its per-pass overhead).

One module per law: ``deploy.simulator.engine`` (vLLM's: ``SimScheduler``) and
``deploy.simulator.llamacpp_law`` (llama.cpp's server: ``LlamaCppScheduler``); ``make_scheduler`` in
``deploy.simulator.laws`` picks one. ``deploy.simulator.virtual`` drives either on a virtual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

from deploy.simulator.presets import SimPreset
from deploy.simulator.tokenizer import Token

Channel = Literal["reasoning", "content"]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token, with its log-probability and the alternatives the model weighed there."""

    channel: Channel
    text: str
    logprob: float = 0.0
    alternatives: tuple[tuple[str, float], ...] = ()  # (token, logprob), best first; the token among them


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The end of a sequence, with what usage needs."""

    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    cached_tokens: int
    created_cache_tokens: int
    completion_tokens: int
    reasoning_tokens: int


Event = TokenEvent | FinishEvent


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt: list[Token]
    output: list[TokenEvent]
    max_tokens: int
    priority: int = 0
    arrival: float = field(default_factory=time.monotonic)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    block_hashes: list[int] = field(default_factory=list)
    prefilled: int = 0
    cached: int = 0
    created: int = 0
    generated: int = 0
    reasoning_generated: int = 0
    first_token_at: float | None = None
    verify_steps: int = 0  # decode steps taken (speculative decoding spreads accepted drafts over them)

    @property
    def prefill_done(self) -> bool:
        """All prompt tokens computed (or taken from the cache)."""
        return self.prefilled >= len(self.prompt)


@dataclass
class EngineCounters:
    """Totals since start, as the engine's /metrics shows them."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    # chat completions whose answer went out whole (the finishing chunk sent, or the uncut body): what a
    # gateway may count as an ``ok`` call (bench/soak.py holds its count to this)
    answers_whole: int = 0


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One engine step: what it computes and how long it lasts at the Spark's pace (before time_scale)."""

    seconds: float
    prefill_tokens: int
    decoding: list[Sequence]
    prefilled_now: list[Sequence]
    passes: int = 1  # forward passes the step ran (vLLM: one; llama.cpp: one per micro-batch and image)


class StepLoop(ABC):
    """An engine's law behind one interface; ``generate`` yields a sequence's events as steps produce them."""

    def __init__(
        self,
        preset: SimPreset,
        time_scale: float,
        observe_ttft: Callable[[float], None] | None = None,
        observe_e2e: Callable[[float], None] | None = None,
    ) -> None:
        self.preset = preset
        self.time_scale = time_scale
        self._observe_ttft = observe_ttft or (lambda _seconds: None)
        self._observe_e2e = observe_e2e or (lambda _seconds: None)
        self.counters = EngineCounters()
        self._running: list[Sequence] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.peak_running = 0
        self.peak_requests = 0  # most requests at the engine at once, running or waiting: a gateway's cap

    # --- the law: what each engine defines -----------------------------------------------------------

    @abstractmethod
    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence for the engine."""

    @abstractmethod
    def plan_step(self) -> StepPlan:
        """Admit what the law admits, then choose this step's work and its duration."""

    @abstractmethod
    def complete_step(self, step: StepPlan, now: float) -> None:
        """The step has run: update caches and emit each sequence's tokens."""

    @property
    @abstractmethod
    def num_waiting(self) -> int:
        """Sequences waiting for a place in the batch."""

    @abstractmethod
    def kv_cache_usage(self) -> float:
        """Share of the engine's KV memory held by running sequences (0..1)."""

    @abstractmethod
    def reset_cache(self) -> None:
        """Forget every cached prompt (vLLM's ``/reset_prefix_cache``)."""

    @abstractmethod
    def _abort(self, sequence: Sequence) -> None:
        """Drop a sequence wherever it is (its caller left)."""

    # --- shared by every law -------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        """Sequences in the running batch."""
        return len(self._running)

    def start(self) -> None:
        """Start the scheduler loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-engine")

    async def stop(self) -> None:
        """Stop the scheduler loop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def generate(self, sequence: Sequence) -> AsyncIterator[Event]:
        """Submit a sequence and yield its events; leaving early aborts it in the engine. The preset's
        ``request_overhead_s`` (the API server's work outside the engine's steps) passes first."""
        if self.preset.request_overhead_s > 0:
            await asyncio.sleep(self.preset.request_overhead_s * self.time_scale)
        self.submit(sequence)
        self._wakeup.set()
        try:
            while True:
                event = await sequence.events.get()
                yield event
                if isinstance(event, FinishEvent):
                    return
        finally:
            self._abort(sequence)

    def _step_seconds(self, prefill_tokens: int, decode_tokens: int, rows: int = 0) -> float:
        """One forward pass, in Spark seconds: its tokens at the preset's rates, the per-pass overhead, its
        ``rows`` (sequences sampled in it) at ``SimPreset.row_cost_s`` each, and the weights its prompt
        tokens read where the preset says (``SimPreset.weight_reads``): the same per-pass hardware cost for
        vLLM's steps and llama.cpp's micro-batches."""
        preset = self.preset
        seconds = preset.step_overhead_s + rows * preset.row_cost_s
        if preset.prefill_tokens_per_s > 0:
            seconds += prefill_tokens / preset.prefill_tokens_per_s
        if preset.decode_tokens_per_s > 0:
            seconds += decode_tokens / preset.decode_tokens_per_s
        if preset.weight_reads is not None:
            seconds += preset.weight_reads.seconds(prefill_tokens)
        return seconds

    async def _loop(self) -> None:
        while True:
            if not self._running and not self.num_waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            step = self.plan_step()
            await asyncio.sleep(step.seconds * self.time_scale)  # sleep(0) still lets the HTTP side run
            self.complete_step(step, time.monotonic())

    def _emit(self, sequence: Sequence, now: float, count: int = 1) -> bool:
        """Emit up to ``count`` tokens; answers whether the sequence finished (and left ``_running``)."""
        if sequence.first_token_at is None:
            sequence.first_token_at = now
            self._observe_ttft(now - sequence.arrival)
        for _ in range(count):
            if sequence.generated >= len(sequence.output) or sequence.generated >= sequence.max_tokens:
                break
            token = sequence.output[sequence.generated]
            sequence.generated += 1
            sequence.reasoning_generated += token.channel == "reasoning"
            sequence.events.put_nowait(token)
        done = sequence.generated >= len(sequence.output)
        if not done and sequence.generated < sequence.max_tokens:
            return False
        self._running.remove(sequence)
        counters = self.counters
        counters.prompt_tokens += len(sequence.prompt)
        counters.generation_tokens += sequence.generated
        counters.requests_finished += 1
        self._observe_e2e(now - sequence.arrival)
        sequence.events.put_nowait(
            FinishEvent(
                finish_reason="stop" if done else "length",
                prompt_tokens=len(sequence.prompt),
                cached_tokens=sequence.cached,
                created_cache_tokens=sequence.created,
                completion_tokens=sequence.generated,
                reasoning_tokens=sequence.reasoning_generated,
            )
        )
        return True
