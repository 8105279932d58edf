"""llama.cpp's server as its source schedules: slots, one batch a loop, micro-batches, per-slot prompt caches.

Read from llama.cpp's `tools/server/server-context.cpp`, `src/llama-batch.cpp`, `src/llama-memory-*.cpp`
(the references and what they imply for the Spark are in docs/engineering.md):

- ``--parallel`` slots, each one sequence; a request waits in the task queue, in order, for an idle slot
  (no priorities). ``get_available_slot`` picks among idle slots the one whose cached tokens share the
  longest common prefix with the prompt, as a share of the prompt above ``--slot-prompt-similarity``
  (0.1), else the least recently used one.
- A slot keeps its last prompt and output in its memory. ``cache_prompt`` reuses their longest common
  prefix with the new prompt (images compared by identity). A model with recurrent (linear-attention)
  layers cannot roll its state back past a few tokens (``llama_memory_recurrent::seq_rm``): the prefix is
  reusable only up to a *context checkpoint* (``--ctx-checkpoints``, 32 a slot) saved at or before it, else
  the whole prompt is computed again. Checkpoints are saved, before the batch that follows them, at the
  start of the last user message and 4 (and 4 + n_ubatch) tokens before the prompt's end, never in a batch
  that decoded an image: for the seed's prompt, right after the shared system prompt.
- ``update_slots`` builds one batch per loop: one token of every generating slot, then prompt tokens of
  the slots in slot order up to ``-b`` (n_batch, 2048). Text prompt tokens and generated tokens share that
  batch; an image is decoded on its own first (``process_mtmd_chunk``), in n_batch pieces. With checkpoints
  the prompt's batches break at the last user message and before the last 4 tokens.
- ``llama_decode`` runs a batch as micro-batches of ``-ub`` (n_ubatch, 512) tokens, each one forward pass.
  With per-slot KV streams (the default with an explicit ``--parallel``) or recurrent layers the split is
  *equal* (``split_equal``): a micro-batch takes the same number of tokens from each sequence in it
  (consecutive slot ids only, without ``--kv-unified``), so one generated token per slot and a prompt's
  tokens land in different passes.
- The host-memory prompt cache (``--cache-ram``, 8 GiB): a slot picked by LRU, or one that would keep
  less than half of its cached tokens, first saves its state there and loads the saved prompt that fits
  the new one better; with ``--kv-unified`` idle slots are saved and cleared at every new request.
- A step costs each forward pass at the preset's rates, its per-pass overhead and the weights its prompt
  tokens read (``StepLoop._step_seconds``, the cost model the vLLM law uses; ``SimPreset.weight_reads``).
  No speculative decoding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from deploy.simulator.presets import SimPreset
from deploy.simulator.scheduler import Sequence, StepLoop, StepPlan
from deploy.simulator.tokenizer import ImageSlot, Token, render_chat

GENERATED: Token = -1  # a slot's output token: never equal to a prompt token
_CHECKPOINT_TAIL = 4  # server-context.cpp: checkpoints 4 and 4 + n_ubatch tokens before the prompt's end


class ContextSizeExceededError(Exception):
    """The prompt does not fit a slot's context (``-c`` divided among ``--parallel`` slots)."""

    def __init__(self, prompt_tokens: int, n_ctx_slot: int) -> None:
        super().__init__(
            f"request ({prompt_tokens} tokens) exceeds the available context size ({n_ctx_slot} tokens), "
            "try increasing it"
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx_slot = n_ctx_slot


@dataclass(frozen=True, slots=True)
class LlamaCppOptions:
    """llama-server's scheduling flags; defaults are llama.cpp's own (common/common.h)."""

    n_parallel: int = 1  # --parallel (an explicit count: per-slot KV streams unless --kv-unified)
    n_ctx: int = 0  # -c: the whole context, split among the slots; 0: the model's (preset's max_model_len)
    n_batch: int = 2048  # -b: tokens in one update_slots batch
    n_ubatch: int = 512  # -ub: tokens in one forward pass
    cache_prompt: bool = True  # --cache-prompt / --no-cache-prompt
    n_ctx_checkpoints: int = 32  # --ctx-checkpoints (per slot)
    checkpoint_min_step: int = 8192  # --checkpoint-min-step
    slot_prompt_similarity: float = 0.1  # --slot-prompt-similarity
    cache_ram_mib: int = 8192  # --cache-ram: -1 no limit, 0 off
    cache_idle_slots: bool = True  # --cache-idle-slots (needs --cache-ram)
    kv_unified: bool = False  # --kv-unified
    # The model, not a flag: recurrent / linear-attention layers (a hybrid like the Spark's), and the state a
    # cached token costs in host memory (its full-attention KV; an estimate for a hybrid MoE, docs).
    recurrent: bool = True
    state_kib_per_token: float = 24.0

    def n_ctx_slot(self, model_len: int) -> int:
        """A slot's context: all of ``-c`` when unified, else its share rounded up to 256."""
        total = self.n_ctx or model_len
        if self.kv_unified:
            return total
        return -(-(total // self.n_parallel) // 256) * 256

    @property
    def checkpoints(self) -> bool:
        """Whether the server saves context checkpoints (recurrent memory cannot be rolled back)."""
        return self.recurrent and self.n_ctx_checkpoints > 0


def common_prefix(a: list[Token], b: list[Token]) -> int:
    """Length of the longest common prefix (list slices compare in C: a binary search stays fast)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@cache
def user_header() -> tuple[Token, ...]:
    """The tokens that open a user message in the chat template (``<|im_start|>user\n``)."""
    return tuple(render_chat([("user", [])], True, False)[:3])


def user_message_starts(prompt: list[Token]) -> list[int]:
    """Where each user message begins (its ``<|im_start|>``), as the chat template's spans mark them."""
    opening, role = user_header()[:2]
    return [i for i in range(len(prompt) - 1) if prompt[i] == opening and prompt[i + 1] == role]


def _image_run(prompt: list[Token], start: int) -> int:
    """Tokens of the image whose first token is at ``start`` (0 when it is text)."""
    first = prompt[start]
    if not isinstance(first, ImageSlot):
        return 0
    end = start
    while end < len(prompt) and _same_image(prompt[end], first):
        end += 1
    return end - start


def _same_image(token: Token, first: ImageSlot) -> bool:
    return isinstance(token, ImageSlot) and token.identity == first.identity


def _is_text(token: Token) -> bool:
    return not isinstance(token, ImageSlot)


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One sequence's tokens in a batch."""

    seq_id: int
    tokens: int
    prompt: bool


def micro_batches(
    entries: list[BatchEntry], n_ubatch: int, *, equal: bool, sequential: bool
) -> list[tuple[int, int]]:
    """(prompt tokens, generated tokens) of each forward pass ``llama_decode`` runs (src/llama-batch.cpp).

    ``split_simple``: the batch in order, n_ubatch tokens at a time. ``split_equal``: every sequence still
    holding tokens (consecutive ids only when ``sequential``) gives the same count, as many as the shortest
    has and n_ubatch allows.
    """
    if not equal:
        flat = [entry.prompt for entry in entries for _ in range(entry.tokens)]
        chunks = [flat[i : i + n_ubatch] for i in range(0, len(flat), n_ubatch)]
        return [(sum(chunk), len(chunk) - sum(chunk)) for chunk in chunks]
    left = [entry.tokens for entry in entries]
    passes: list[tuple[int, int]] = []
    while any(left):
        members: list[int] = []
        last_id = -1
        for index, entry in enumerate(entries):
            if left[index] and (not sequential or not members or entry.seq_id == last_id + 1):
                members.append(index)
                last_id = entry.seq_id
        take = min(min(left[i] for i in members), max(1, n_ubatch // len(members)))
        for i in members:
            left[i] -= take
        prompt = sum(take for i in members if entries[i].prompt)
        passes.append((prompt, take * len(members) - prompt))
    return passes


@dataclass(eq=False)
class Slot:
    """One server slot: what its memory holds and where its checkpoints are."""

    id: int
    tokens: list[Token] = field(default_factory=list)  # the last prompt (and output) in its memory
    checkpoints: list[int] = field(default_factory=list)  # token counts whose recurrent state was saved
    last_used: float = -1.0
    sequence: Sequence | None = None


class HostPromptCache:
    """``--cache-ram``: saved slot states, oldest evicted first past the limit (server-task.cpp)."""

    def __init__(self, limit_tokens: int | None) -> None:
        self.limit_tokens = limit_tokens
        self.entries: deque[tuple[list[Token], list[int]]] = deque()

    def save(self, tokens: list[Token], checkpoints: list[int]) -> None:
        """``server_prompt_cache::alloc``: skip what is held already, drop what the new one contains."""
        if not tokens or any(common_prefix(held, tokens) == len(tokens) for held, _ in self.entries):
            return
        kept = [(held, marks) for held, marks in self.entries if common_prefix(held, tokens) < len(held)]
        self.entries = deque(kept)
        self.entries.append((list(tokens), list(checkpoints)))
        limit = self.limit_tokens
        while limit is not None and sum(len(held) for held, _ in self.entries) > limit:
            self.entries.popleft()

    def load(self, slot_tokens: list[Token], prompt: list[Token]) -> tuple[list[Token], list[int]] | None:
        """``server_prompt_cache::load``: the saved prompt keeping more of itself and more of the new one."""
        lcp = common_prefix(slot_tokens, prompt)
        keep_best = lcp / len(slot_tokens) if slot_tokens else -1.0
        sim_best = lcp / len(prompt)
        best = None
        for entry in self.entries:
            shared = common_prefix(entry[0], prompt)
            keep, sim = shared / len(entry[0]), shared / len(prompt)
            if keep < 0.25:  # don't trash large prompts
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, entry
        if best is not None:
            self.entries.remove(best)
        return best


class LlamaCppScheduler(StepLoop):
    """llama.cpp's server law behind the simulator's scheduler interface (``StepLoop``)."""

    def __init__(
        self,
        preset: SimPreset,
        time_scale: float,
        options: LlamaCppOptions | None = None,
        observe_ttft: Callable[[float], None] | None = None,
        observe_e2e: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(preset, time_scale, observe_ttft, observe_e2e)
        self.options = options = options or LlamaCppOptions()
        self.slots = [Slot(i) for i in range(options.n_parallel)]
        self.n_ctx_slot = options.n_ctx_slot(preset.max_model_len)
        limit = None
        if options.cache_ram_mib > 0:
            total = (options.n_ctx or preset.max_model_len)
            limit = max(total, int(options.cache_ram_mib * 1024 / options.state_kib_per_token))
        self.host_cache = HostPromptCache(limit) if options.cache_ram_mib != 0 else None
        self._waiting: deque[Sequence] = deque()
        self._slot_of: dict[Sequence, Slot] = {}
        self._clock = 0.0
        self.checkpoints_restored = 0
        self.full_reprocessing = 0  # prompts computed again for want of a checkpoint
        # metrics_post_decode (server-context.cpp), once per update_slots batch that decodes: its /metrics'
        # n_decode_total (images decoded on their own are not counted) and the busy slots summed over them
        self.n_decode = 0
        self.n_busy_slots = 0

    @property
    def num_waiting(self) -> int:
        """Requests waiting in the task queue for an idle slot."""
        return len(self._waiting)

    def slot_of(self, sequence: Sequence) -> Slot | None:
        """The slot a request runs in (None while it waits)."""
        return self._slot_of.get(sequence)

    def kv_cache_usage(self) -> float:
        """Share of the context held by busy slots."""
        used = sum(s.sequence.prefilled + s.sequence.generated for s in self.slots if s.sequence is not None)
        return min(1.0, used / max(1, self.n_ctx_slot * (1 if self.options.kv_unified else len(self.slots))))

    def reset_cache(self) -> None:
        """Forget what idle slots and the host cache hold."""
        for slot in self.slots:
            if slot.sequence is None:
                slot.tokens, slot.checkpoints = [], []
        if self.host_cache is not None:
            self.host_cache.entries.clear()

    def submit(self, sequence: Sequence) -> None:
        """Queue a request for a slot; a prompt that cannot fit a slot's context is refused."""
        if len(sequence.prompt) >= self.n_ctx_slot:
            raise ContextSizeExceededError(len(sequence.prompt), self.n_ctx_slot)
        sequence.max_tokens = min(sequence.max_tokens, self.n_ctx_slot - len(sequence.prompt))
        self._waiting.append(sequence)
        self.peak_requests = max(self.peak_requests, len(self._running) + len(self._waiting))

    def _abort(self, sequence: Sequence) -> None:
        if sequence in self._waiting:
            self._waiting.remove(sequence)
        if sequence in self._running:
            self._running.remove(sequence)
        slot = self._slot_of.pop(sequence, None)
        if slot is not None:
            slot.tokens = sequence.prompt[: sequence.prefilled]
            slot.sequence, slot.last_used = None, self._clock

    # --- a request takes a slot ----------------------------------------------------------------------

    def _assign(self) -> None:
        while self._waiting:
            slot = self._available_slot(self._waiting[0].prompt)
            if slot is None:
                return
            sequence = self._waiting.popleft()
            self._start(slot, sequence)
            if self.host_cache is not None and self.options.cache_idle_slots:
                for idle in self.slots:
                    if idle.sequence is None:
                        self.host_cache.save(idle.tokens, idle.checkpoints)
                        if self.options.kv_unified:
                            idle.tokens, idle.checkpoints = [], []
        self.peak_running = max(self.peak_running, len(self._running))

    def _available_slot(self, prompt: list[Token]) -> Slot | None:
        """``get_available_slot``: the most similar idle slot, else the least recently used."""
        idle = [slot for slot in self.slots if slot.sequence is None]
        chosen: Slot | None = None
        save = False
        threshold = self.options.slot_prompt_similarity
        if threshold:
            best = 0.0
            for slot in idle:
                if slot.tokens:
                    similarity = common_prefix(slot.tokens, prompt) / len(prompt)
                    if similarity > best and similarity > threshold:
                        best, chosen = similarity, slot
            if chosen is not None and best * len(prompt) / len(chosen.tokens) < 0.5:
                save = True  # about to lose most of its context: keep it in the host cache
        if chosen is None:
            last = -1.0
            for slot in idle:
                if chosen is None or slot.last_used <= last:
                    chosen, last = slot, slot.last_used
            save = chosen is not None
        if chosen is not None and save and self.host_cache is not None:
            self.host_cache.save(chosen.tokens, chosen.checkpoints)
            loaded = self.host_cache.load(chosen.tokens, prompt)
            if loaded is not None:
                chosen.tokens, chosen.checkpoints = loaded
        return chosen

    def _start(self, slot: Slot, sequence: Sequence) -> None:
        """The prompt's reusable prefix: common tokens, cut back to a checkpoint if the state is recurrent."""
        prompt = sequence.prompt
        reused = common_prefix(slot.tokens, prompt) if self.options.cache_prompt else 0
        if reused and self.options.recurrent and reused < len(slot.tokens):
            usable = [mark for mark in slot.checkpoints if mark <= reused]
            if usable:
                reused = max(usable)
                self.checkpoints_restored += 1
            else:
                reused = 0
                self.full_reprocessing += 1
        slot.checkpoints = [mark for mark in slot.checkpoints if mark <= reused]
        if reused == len(prompt):
            reused -= 1  # at least one token is evaluated, for its logits
        sequence.cached = sequence.prefilled = reused
        self.counters.prefix_cache_queries += len(prompt)
        self.counters.prefix_cache_hits += reused
        slot.sequence = sequence
        self._slot_of[sequence] = slot
        self._running.append(sequence)

    # --- one update_slots loop -----------------------------------------------------------------------

    def plan_step(self) -> StepPlan:
        """One ``update_slots``: the generating slots' tokens, prompt chunks, images decoded on their own."""
        self._assign()
        options = self.options
        busy = [slot for slot in self.slots if slot.sequence is not None]
        generating = [slot for slot in busy if slot.sequence is not None and slot.sequence.prefill_done]
        decoding = [slot.sequence for slot in generating if slot.sequence is not None]
        entries = [BatchEntry(slot.id, 1, False) for slot in generating]
        size = len(entries)
        image_passes: list[tuple[int, int]] = []
        prefilled_now: list[Sequence] = []
        for slot in busy:
            sequence = slot.sequence
            if sequence is None or sequence.prefill_done:
                continue
            if size >= options.n_batch:
                break
            added = self._prompt_chunk(slot, sequence, image_passes, options.n_batch - size)
            size += added
            if added:
                entries.append(BatchEntry(slot.id, added, True))
            if sequence.prefill_done:
                prefilled_now.append(sequence)
        prefill_tokens = sum(p for p, _ in image_passes) + sum(e.tokens for e in entries if e.prompt)
        if entries:  # an empty batch is not decoded ("no tokens to decode")
            self.n_decode += 1
            self.n_busy_slots += len(busy)
        main = micro_batches(entries, options.n_ubatch, equal=options.recurrent or not options.kv_unified,
                             sequential=not options.kv_unified)
        passes = image_passes + main
        seconds = sum(self._step_seconds(prompt, generated) for prompt, generated in passes)
        return StepPlan(seconds, prefill_tokens, decoding, prefilled_now, passes=len(passes))

    def _prompt_chunk(
        self, slot: Slot, sequence: Sequence, image_passes: list[tuple[int, int]], room: int
    ) -> int:
        """This loop's share of a prompt: images at its position first, then text up to a break.

        Images go to ``image_passes`` (decoded alone, before the batch); answers the text tokens added.
        """
        options, prompt = self.options, sequence.prompt
        had_image = False
        while not sequence.prefill_done and (image := _image_run(prompt, sequence.prefilled)):
            for piece in range(0, image, options.n_batch):  # mtmd_helper_decode_image_chunk: n_batch pieces
                chunk = min(options.n_batch, image - piece)
                image_passes += [
                    (min(options.n_ubatch, chunk - u), 0) for u in range(0, chunk, options.n_ubatch)
                ]
            sequence.prefilled += image
            had_image = True
        start = sequence.prefilled
        starts = user_message_starts(prompt) if options.checkpoints else []
        last_user = starts[-1] if starts else -1
        tails = {min(options.n_batch, _CHECKPOINT_TAIL + extra) for extra in (options.n_ubatch, 0)}
        added = 0
        while added < room and not sequence.prefill_done and _is_text(prompt[sequence.prefilled]):
            sequence.prefilled += 1
            added += 1
            if not options.checkpoints:
                continue
            position = sequence.prefilled
            if position in starts and (
                position == last_user
                or not slot.checkpoints
                or position > slot.checkpoints[-1] + options.checkpoint_min_step
            ):
                break
            if len(prompt) - position in tails:
                break
        if options.checkpoints and start > 0 and not had_image:
            near_end = len(prompt) < sequence.prefilled + options.n_ubatch
            at_user = start in starts
            if (at_user or near_end) and (
                not slot.checkpoints or start == last_user or near_end
                or start > slot.checkpoints[-1] + options.checkpoint_min_step
            ):
                self._checkpoint(slot, start)
        return added

    def _checkpoint(self, slot: Slot, position: int) -> None:
        """``create_checkpoint``: the state after ``position`` tokens, the oldest dropped when full."""
        marks = [mark for mark in slot.checkpoints if mark != position]
        while len(marks) >= self.options.n_ctx_checkpoints:
            marks.pop(0)
        slot.checkpoints = [*marks, position]

    def complete_step(self, step: StepPlan, now: float) -> None:
        """The batch has run: each generating slot and each finished prompt samples one token."""
        self._clock = now
        for sequence in [*step.decoding, *step.prefilled_now]:
            if sequence in self._running and self._emit(sequence, now, 1):
                self._release(sequence, now)

    def _release(self, sequence: Sequence, now: float) -> None:
        """The slot keeps the prompt and the output it decoded (all but the last sampled token)."""
        slot = self._slot_of.pop(sequence)
        slot.tokens = [*sequence.prompt, *[GENERATED] * max(0, sequence.generated - 1)]
        slot.sequence, slot.last_used = None, now

