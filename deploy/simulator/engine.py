"""The simulated engine's scheduler: continuous batching, chunked prefill and a full-block prefix cache.

One step at a time, as vLLM does: up to ``max_num_seqs`` sequences run; each step spends at most
``max_num_batched_tokens`` on the decode tokens of the running sequences plus prefill chunks of new ones;
the step lasts ``prefill_tokens / prefill_rate + decode_tokens / decode_rate`` (times ``time_scale``), so
aggregate decode stays flat whatever the batch, as on the Spark's MoE, plus a fixed cost a step and a cost
per sequence in it (``SimPreset.row_cost_s``: 0 on the Spark; the real vLLM CPU engine's sampled row).
That is the whole cost model (docs/engineering.md); two engine options extend it, each only by its mechanism:

- speculative decoding (MTP): each decoding sequence verifies ``1 + num_speculative_tokens`` tokens per
  step, each costing what a decode token costs, and gains ``1 + accepted`` tokens, the accepted drafts
  being ``draft_acceptance_rate`` of the drafted ones on average (spread evenly over the steps);
- prefill caps: prefill tokens per step capped in total (the Spark fork's
  ``--max-num-prefill-tokens-per-step``), per sequence (vLLM's ``--long-prefill-token-threshold``, which
  vLLM applies only while another request runs or waits), in
  sequences (the fork's ``--max-parallel-prefills``), or to a share of the step's time while sequences
  decode (the fork's ``--prefill-compute-share``).

``plan_step`` and ``complete_step`` are the step model itself: the asyncio loop below sleeps through each
step, and ``deploy.simulator.virtual`` runs the same two on a virtual clock (no sleeping).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable

from deploy.simulator.presets import SimPreset
from deploy.simulator.scheduler import (
    Channel,
    EngineCounters,
    Event,
    FinishEvent,
    Sequence,
    StepLoop,
    StepPlan,
    TokenEvent,
)
from deploy.simulator.tokenizer import Token

# The vocabulary lives in deploy.simulator.scheduler; re-exported for the modules that import it from here.
__all__ = [
    "Channel",
    "EngineCounters",
    "Event",
    "FinishEvent",
    "HybridPrefixCache",
    "PrefixCache",
    "Sequence",
    "SimScheduler",
    "StepPlan",
    "TokenEvent",
]


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


class HybridPrefixCache(PrefixCache):
    """A hybrid model's cache in vLLM's "align" mode: a hit needs the linear-attention state where it ends.

    vLLM keeps a linear-attention (Mamba, Gated DeltaNet) state only where a prefill chunk ends on a block
    boundary and, with ``--prefix-match-unit U`` finer than the block, at the prompt's last ``U`` boundary
    short of its last token (``_mamba_block_aligned_split`` and ``get_mamba_prefill_checkpoint_position``
    in vLLM's v1 scheduler). A request then hits at the longest ``U`` multiple of its own prompt (never its
    last token) where a state was kept for the same leading tokens. So a shared prefix shorter than a block
    hits only after a request whose prompt ends at the shared prefix (or within its last unit) kept a state
    there: the gateway's priming request.

    ``hashes`` are one per ``unit`` boundary before the prompt's last token, each chained to the one before,
    so the last one is the prompt's tail checkpoint. Capacity counts kept states, least recently used first.
    """

    def __init__(self, block_size: int, capacity_blocks: int, unit: int | None) -> None:
        super().__init__(block_size, capacity_blocks)
        self.unit = unit or block_size

    def block_hashes(self, tokens: list[Token]) -> list[int]:
        """One chained hash per ``unit`` boundary up to the last one before the prompt's last token."""
        hashes, parent = [], 0
        last = (len(tokens) - 1) // self.unit * self.unit
        for start in range(0, last, self.unit):
            parent = hash((parent, tuple(tokens[start : start + self.unit])))
            hashes.append(parent)
        return hashes

    def lookup(self, hashes: list[int], prompt_len: int) -> int:
        """The longest prefix, in units, whose state was kept (the hashes already stop short of the end)."""
        for count in range(len(hashes), 0, -1):
            if hashes[count - 1] in self._blocks:
                self._blocks.move_to_end(hashes[count - 1])
                return count * self.unit
        return 0

    def insert(self, hashes: list[int]) -> int:
        """Keep the states at every block boundary and at the tail checkpoint; answers 0 tokens created, as
        the real hybrid engine reports (``created_cache_tokens`` stayed 0 on every request)."""
        per_block = self.block_size // self.unit
        kept = [h for index, h in enumerate(hashes, start=1) if index % per_block == 0]
        if hashes and (not kept or kept[-1] != hashes[-1]):
            kept.append(hashes[-1])
        super().insert(kept)
        return 0


class SimScheduler(StepLoop):
    """vLLM's law: admission into at most ``max_num_seqs``, chunked prefill, one pass a step."""

    def __init__(
        self,
        preset: SimPreset,
        time_scale: float,
        observe_ttft: Callable[[float], None] | None = None,
        observe_e2e: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(preset, time_scale, observe_ttft, observe_e2e)
        self.cache = (
            HybridPrefixCache(preset.block_size, preset.kv_cache_blocks, preset.prefix_match_unit)
            if preset.mamba_cache_mode == "align"
            else PrefixCache(preset.block_size, preset.kv_cache_blocks)
        )
        self._waiting: list[tuple[int, int, Sequence]] = []  # (priority, arrival order, sequence)
        self._order = itertools.count()

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for a batch slot."""
        return len(self._waiting)

    def reset_cache(self) -> None:
        """Forget every cached block."""
        self.cache.reset()

    def kv_cache_usage(self) -> float:
        """Share of KV blocks held by running sequences (0..1)."""
        block = self.preset.block_size
        used = sum(-(-(s.prefilled + s.generated) // block) for s in self._running)
        return min(1.0, used / max(1, self.preset.kv_cache_blocks))

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence for a batch slot (in priority order under ``scheduling_policy`` priority)."""
        priority = sequence.priority if self.preset.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (priority, next(self._order), sequence))
        self.peak_requests = max(self.peak_requests, len(self._running) + len(self._waiting))

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

    def _prefill_allowance(self, decode_tokens: int) -> int:
        """The most prefill tokens this step may compute, after the decode tokens took their share."""
        preset = self.preset
        allowance = preset.max_num_batched_tokens - decode_tokens
        if preset.max_num_prefill_tokens_per_step is not None:
            allowance = min(allowance, preset.max_num_prefill_tokens_per_step)
        share = preset.prefill_compute_share
        if share is not None and decode_tokens and 0 < share < 1 and preset.decode_tokens_per_s > 0:
            # Prefill may take at most `share` of the step's time while sequences decode; with nothing
            # decoding the step is all prefill (an engine with work to do does not idle).
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
        # vLLM's scheduler (v1/core/sched/scheduler.py) drops the per-sequence threshold when one request
        # is running or waiting in all: there is nobody for its long prefill to starve.
        alone = len(self._running) + len(self._waiting) <= 1
        per_sequence = None if alone else preset.long_prefill_token_threshold or None
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
        # Every sequence in the step is a sampled row (vLLM samples a partial prefill's too and drops it).
        seconds = self._step_seconds(prefill_tokens, decode_tokens, rows=len(decoding) + prefilling)
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
