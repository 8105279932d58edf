"""The simulated engine's scheduler: continuous batching, chunked prefill and a full-block prefix cache.

One step at a time, as vLLM does: up to ``max_num_seqs`` sequences run; each step spends at most
``max_num_batched_tokens`` on the decode tokens of the running sequences plus prefill chunks of new ones;
the step lasts ``prefill_tokens / prefill_rate + decode_tokens / decode_rate`` (times ``time_scale``), so
aggregate decode stays flat whatever the batch, as on the Spark's MoE. That is the whole cost model
(docs/simulator.md); two engine options extend it, each only by its mechanism:

- speculative decoding (MTP): each decoding sequence verifies ``1 + num_speculative_tokens`` tokens per
  step, each costing what a decode token costs, and gains ``1 + accepted`` tokens, the accepted drafts
  being ``draft_acceptance_rate`` of the drafted ones on average (spread evenly over the steps);
- prefill caps: prefill tokens per step capped in total (the Spark fork's
  ``--max-num-prefill-tokens-per-step``), per sequence (vLLM's ``--long-prefill-token-threshold``), in
  sequences (the fork's ``--max-parallel-prefills``), or to a share of the step's time while sequences
  decode (the fork's ``--prefill-compute-share``).

``plan_step`` and ``complete_step`` are the step model itself: the asyncio loop below sleeps through each
step, and ``deploy.simulator.virtual`` runs the same two on a virtual clock (no sleeping).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import OrderedDict
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


class PrefixCache:
    """Chained hashes over full blocks only, least recently used evicted first."""

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def block_hashes(self, tokens: list[Token]) -> list[int]:
        """One hash per full block; each chains the one before (a block is reused only after its prefix)."""
        hashes, parent = [], 0
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = hash((parent, tuple(tokens[start : start + self.block_size])))
            hashes.append(parent)
        return hashes

    def lookup(self, hashes: list[int], prompt_len: int) -> int:
        """Tokens served from the cache: whole blocks, never the last prompt token (it is recomputed)."""
        usable = (prompt_len - 1) // self.block_size
        hits = 0
        for block in hashes[:usable]:
            if block not in self._blocks:
                break
            self._blocks.move_to_end(block)
            hits += 1
        return hits * self.block_size

    def insert(self, hashes: list[int]) -> int:
        """Store a computed prompt's full blocks; answers how many tokens were newly cached."""
        created = 0
        for block in hashes:
            if block in self._blocks:
                self._blocks.move_to_end(block)
                continue
            self._blocks[block] = None
            created += 1
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
        return created * self.block_size

    def reset(self) -> None:
        """Forget every block."""
        self._blocks.clear()


@dataclass
class EngineCounters:
    """Totals since start, as the engine's /metrics shows them."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One engine step: what it computes and how long it lasts at the Spark's pace (before time_scale)."""

    seconds: float
    prefill_tokens: int
    decoding: list[Sequence]
    prefilled_now: list[Sequence]


class SimScheduler:
    """The scheduler loop; ``generate`` yields a sequence's events as steps produce them."""

    def __init__(
        self,
        preset: SimPreset,
        time_scale: float,
        observe_ttft: Callable[[float], None] | None = None,
        observe_e2e: Callable[[float], None] | None = None,
    ) -> None:
        self.preset = preset
        self._observe_ttft = observe_ttft or (lambda _seconds: None)
        self._observe_e2e = observe_e2e or (lambda _seconds: None)
        self.time_scale = time_scale
        self.cache = PrefixCache(preset.block_size, preset.kv_cache_blocks)
        self.counters = EngineCounters()
        self._waiting: list[tuple[int, int, Sequence]] = []  # (priority, arrival order, sequence)
        self._order = itertools.count()
        self._running: list[Sequence] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.peak_running = 0

    @property
    def num_running(self) -> int:
        """Sequences in the running batch."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for a batch slot."""
        return len(self._waiting)

    def kv_cache_usage(self) -> float:
        """Share of KV blocks held by running sequences (0..1)."""
        block = self.preset.block_size
        used = sum(-(-(s.prefilled + s.generated) // block) for s in self._running)
        return min(1.0, used / max(1, self.preset.kv_cache_blocks))

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
        """Submit a sequence and yield its events; leaving early aborts it in the engine."""
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

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence for a batch slot (in priority order under ``scheduling_policy`` priority)."""
        priority = sequence.priority if self.preset.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (priority, next(self._order), sequence))

    def _abort(self, sequence: Sequence) -> None:
        if sequence in self._running:
            self._running.remove(sequence)
        self._waiting = [item for item in self._waiting if item[2] is not sequence]
        heapq.heapify(self._waiting)

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.preset.max_num_seqs:
            _, _, sequence = heapq.heappop(self._waiting)
            sequence.block_hashes = self.cache.block_hashes(sequence.prompt)
            sequence.cached = self.cache.lookup(sequence.block_hashes, len(sequence.prompt))
            sequence.prefilled = sequence.cached
            self.counters.prefix_cache_queries += len(sequence.prompt)
            self.counters.prefix_cache_hits += sequence.cached
            self._running.append(sequence)
        self.peak_running = max(self.peak_running, len(self._running))

    def _tokens_per_verify(self) -> int:
        """Tokens a decoding sequence runs through the model per step: its next one plus the drafts."""
        return 1 + max(0, self.preset.num_speculative_tokens)

    def _step_seconds(self, prefill_tokens: int, decode_tokens: int) -> float:
        """The cost model, in Spark seconds: prefill and decode tokens at their rates (time_scale apart)."""
        preset = self.preset
        seconds = preset.step_overhead_s
        if preset.weight_reads is not None:
            seconds += preset.weight_reads.seconds(prefill_tokens)
        if preset.prefill_tokens_per_s > 0:
            seconds += prefill_tokens / preset.prefill_tokens_per_s
        if preset.decode_tokens_per_s > 0:
            seconds += decode_tokens / preset.decode_tokens_per_s
        return seconds

    def _prefill_allowance(self, decode_tokens: int) -> int:
        """The most prefill tokens this step may compute, after the decode tokens took their share."""
        preset = self.preset
        allowance = preset.max_num_batched_tokens - decode_tokens
        if preset.max_num_prefill_tokens_per_step is not None:
            allowance = min(allowance, preset.max_num_prefill_tokens_per_step)
        share = preset.prefill_compute_share
        if share is not None and decode_tokens and 0 < share < 1 and preset.decode_tokens_per_s > 0:
            # Prefill may take at most `share` of the step's compute while sequences decode (tokens at the
            # two rates; the weights a chunk reads are not counted against it); with nothing decoding the
            # step is all prefill (an engine with work to do does not idle).
            decode_s = decode_tokens / preset.decode_tokens_per_s
            allowance = min(allowance, int(share / (1 - share) * decode_s * preset.prefill_tokens_per_s))
        return max(0, allowance)

    def plan_step(self) -> StepPlan:
        """Admit what fits, then choose this step's decode tokens and prefill chunks."""
        self._admit()
        preset = self.preset
        decoding = [s for s in self._running if s.prefill_done]
        decode_tokens = len(decoding) * self._tokens_per_verify()
        budget = self._prefill_allowance(decode_tokens)
        per_sequence = preset.long_prefill_token_threshold or None
        prefill_tokens, prefilled_now, prefilling = 0, list[Sequence](), 0
        for sequence in self._running:
            if sequence.prefill_done or budget <= 0:
                continue
            if preset.max_parallel_prefills is not None and prefilling >= preset.max_parallel_prefills:
                break
            remaining = len(sequence.prompt) - sequence.prefilled
            if not preset.enable_chunked_prefill and remaining > budget:
                break  # without chunked prefill a prompt is computed whole or waits
            chunk = min(budget, remaining, per_sequence or remaining)
            sequence.prefilled += chunk
            budget -= chunk
            prefill_tokens += chunk
            prefilling += 1
            if sequence.prefill_done:
                prefilled_now.append(sequence)
        seconds = self._step_seconds(prefill_tokens, decode_tokens)
        return StepPlan(seconds, prefill_tokens, decoding, prefilled_now)

    def complete_step(self, step: StepPlan, now: float) -> None:
        """The step has run: cache what was prefilled and emit each sequence's tokens."""
        for sequence in step.prefilled_now:
            sequence.created = self.cache.insert(sequence.block_hashes)
        for sequence in step.decoding:
            if sequence in self._running:  # not aborted while the step ran
                self._emit(sequence, now, 1 + self._accepted_drafts(sequence))
        for sequence in step.prefilled_now:
            if sequence in self._running:
                self._emit(sequence, now, 1)  # a prefill's step samples one token, drafts none yet

    def _accepted_drafts(self, sequence: Sequence) -> int:
        """Drafts accepted at this verify step: the acceptance rate's share, spread evenly over steps."""
        drafted = max(0, self.preset.num_speculative_tokens)
        sequence.verify_steps += 1
        if not drafted:
            return 0
        mean = drafted * self.preset.draft_acceptance_rate
        step = sequence.verify_steps
        return min(drafted, int(step * mean) - int((step - 1) * mean))

    async def _loop(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            step = self.plan_step()
            await asyncio.sleep(step.seconds * self.time_scale)  # sleep(0) still lets the HTTP side run
            self.complete_step(step, time.monotonic())

    def _emit(self, sequence: Sequence, now: float, count: int = 1) -> None:
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
            return
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
