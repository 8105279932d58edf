"""The simulated engine's scheduler: continuous batching, chunked prefill and a full-block prefix cache.

One step at a time, as vLLM does: up to ``max_num_seqs`` sequences run; each step spends at most
``max_num_batched_tokens`` on one decode token per running sequence plus prefill chunks of new ones; the
step lasts ``prefill_tokens / prefill_rate + decoding_sequences / decode_rate`` (times ``time_scale``),
so aggregate decode stays flat whatever the batch, as on the Spark's MoE.
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
        priority = sequence.priority if self.preset.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (priority, next(self._order), sequence))
        self._wakeup.set()
        try:
            while True:
                event = await sequence.events.get()
                yield event
                if isinstance(event, FinishEvent):
                    return
        finally:
            self._abort(sequence)

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

    def _step_seconds(self, prefill_tokens: int, decoding: int) -> float:
        preset = self.preset
        seconds = preset.step_overhead_s
        if preset.prefill_tokens_per_s > 0:
            seconds += prefill_tokens / preset.prefill_tokens_per_s
        if preset.decode_tokens_per_s > 0:
            seconds += decoding / preset.decode_tokens_per_s
        return seconds * self.time_scale

    async def _loop(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            self._admit()
            decoding = [s for s in self._running if s.prefill_done]
            budget = self.preset.max_num_batched_tokens - len(decoding)
            prefill_tokens, prefilled_now = 0, list[Sequence]()
            for sequence in self._running:
                if sequence.prefill_done or budget <= 0:
                    continue
                chunk = min(budget, len(sequence.prompt) - sequence.prefilled)
                sequence.prefilled += chunk
                budget -= chunk
                prefill_tokens += chunk
                if sequence.prefill_done:
                    prefilled_now.append(sequence)
            seconds = self._step_seconds(prefill_tokens, len(decoding))
            await asyncio.sleep(seconds)  # sleep(0) still lets the HTTP side run between steps
            now = time.monotonic()
            for sequence in prefilled_now:
                sequence.created = self.cache.insert(sequence.block_hashes)
            for sequence in decoding + prefilled_now:
                if sequence in self._running:  # not aborted while the step ran
                    self._emit(sequence, now)

    def _emit(self, sequence: Sequence, now: float) -> None:
        if sequence.first_token_at is None:
            sequence.first_token_at = now
            self._observe_ttft(now - sequence.arrival)
        if sequence.generated < len(sequence.output) and sequence.generated < sequence.max_tokens:
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
