"""Prefix planning: how many prompt tokens per request the engine's prefix cache can ever serve, and why.

vLLM hashes a prompt in full blocks of ``B`` tokens, each hash chained to the one before, and never serves
the last prompt token from the cache. Blocks that overlap an image also hash the image's identity. So a
request can reuse only whole blocks of the prefix that every request shares (the system prompt and the
chat template up to the first image), and at most ``floor((n-1)/B)·B`` of its ``n`` tokens:

    cacheable = min(floor(shared / B)·B, floor((n - 1) / B)·B)

On the Spark the shared prefix is 416 tokens and ``B`` is 2,960 (the hybrid model's block): nothing is ever
reused. The one change that makes it hit without touching the image or the engine is to make the shared
prefix end on a whole block, by filling it with policy text the model can use anyway (guidelines and
worked examples, ``shaping/prompts/guidance.<version>.txt``, one version per verdict format).
:class:`BlockFill` finds how much of it.

Token counts come from the engine's own ``/tokenize`` (or the simulator's tokenizer): :class:`BlockFill`
is sans-IO, it proposes system prompts and the caller measures them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources

from shaping.prompt import normalize_prompt
from shaping.verdict import VerdictFormat

DEFAULT_GUIDANCE_VERSION = "v1"
# The guidance that agrees with each verdict format's system prompt: v1 writes its examples and output rules
# as JSON with a written confidence, v2 as compact lines (the confidence comes from the engine's logprobs).
GUIDANCE_VERSIONS: dict[VerdictFormat, str] = {"json": "v1", "compact": "v2"}

# Where a guidance line may be cut: after a sentence or clause mark (full-width or ASCII). Not after an ASCII
# mark that a letter follows: that is inside a compact verdict (``block:violence,hate``), never a clause end.
_CLAUSE_END = re.compile(r"(?<=[。；！？：，])|(?<=[;.!?:,])(?![A-Za-z])")


def cacheable_tokens(shared_prefix_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens one request can ever take from the prefix cache (whole shared blocks, never the last)."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1 token, got {block_size}")
    if prompt_tokens < 1 or shared_prefix_tokens < 1:
        return 0
    shared_blocks = min(shared_prefix_tokens, prompt_tokens) // block_size
    usable_blocks = (prompt_tokens - 1) // block_size
    return min(shared_blocks, usable_blocks) * block_size


def shared_prefix_length(first: Sequence[int], second: Sequence[int]) -> int:
    """How many leading token ids two prompts have in common."""
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


def next_block_boundary(tokens: int, block_size: int) -> int:
    """The smallest whole number of blocks that holds ``tokens`` (``tokens`` itself if already whole)."""
    return -(-tokens // block_size) * block_size


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What one engine request is made of, in tokens (measured on the engine or the simulator)."""

    shared_prefix_tokens: int  # identical in every request: system prompt and template up to the first image
    prompt_tokens: int  # the whole prompt of one request
    frames: int = 1  # keyframes packed into the request


@dataclass(frozen=True, slots=True)
class PrefixPlan:
    """What the prefix cache can do for a request shape on an engine of a given block size."""

    block_size: int
    shape: RequestShape
    cacheable_tokens: int
    reason: str
    changes: tuple[str, ...] = field(default=())

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens every request computes, cache or not."""
        return self.shape.prompt_tokens - self.cacheable_tokens

    @property
    def uncached_tokens_per_frame(self) -> float:
        """Prefill work per keyframe once the cache is warm."""
        return self.uncached_tokens / max(1, self.shape.frames)


def plan_prefix(shape: RequestShape, block_size: int) -> PrefixPlan:
    """How many tokens per request can come from the cache, why, and which change would make more hit."""
    shared, n, b = shape.shared_prefix_tokens, shape.prompt_tokens, block_size
    cached = cacheable_tokens(shared, n, b)
    boundary = next_block_boundary(shared, b)
    pad = boundary - shared
    per_frame = f" ({(n - shared) / shape.frames:,.0f} per keyframe)" if shape.frames > 1 else ""
    fill = (
        f"fill the shared prefix with {pad:,} tokens of policy text to {boundary:,} tokens "
        f"(modgate cache plan --fill; MODGATE_SHAPING__BLOCK_FILLING_PREFIX=true): then {boundary:,} tokens "
        f"per request come from the cache and each request computes {n - shared:,}{per_frame} instead of "
        f"{n:,}"
    )
    if shared < b:
        reason = f"shared prefix {shared:,} tokens < block {b:,}: no request can hit"
        changes = [fill]
        if b > n:
            changes.append(
                f"or a block size of at most {shared:,} tokens, where the model allows one (a hybrid model's "
                "block is fixed by its linear-attention state)"
            )
        return PrefixPlan(b, shape, cached, reason, tuple(changes))
    waste = shared - cached
    reason = (
        f"{cached:,} of {n:,} prompt tokens per request can come from the cache: {cached // b:,} whole "
        f"block(s) of the {shared:,}-token shared prefix"
    )
    if waste == 0:
        return PrefixPlan(b, shape, cached, reason + "; the shared prefix ends on a block boundary", ())
    reason += f"; its last {waste:,} tokens do not fill a block and are computed by every request"
    change = (
        f"trim the shared prefix by {waste:,} tokens to {shared - waste:,}, or fill it by {pad:,} more to "
        f"{boundary:,}: either way no request computes shared tokens any more"
    )
    return PrefixPlan(b, shape, cached, reason, (change,))


def guidance_version_for(verdict_format: VerdictFormat) -> str:
    """The guidance version that agrees with the system prompt asking for ``verdict_format``."""
    return GUIDANCE_VERSIONS[verdict_format]


def load_guidance(version: str = DEFAULT_GUIDANCE_VERSION) -> list[str]:
    """The policy guidance lines of one version, in order of importance (comments and blank lines dropped)."""
    raw = resources.files("shaping.prompts").joinpath(f"guidance.{version}.txt").read_text(encoding="utf-8")
    lines = normalize_prompt(raw).split("\n")
    return [line for line in lines if line.strip() and not line.startswith("#")]


def guidance_pieces(lines: Sequence[str]) -> list[tuple[int, str]]:
    """Each guidance line cut after its clause marks: ``(line index, piece)``, in order.

    The fill may end after any piece, so a partial line still ends on a punctuation mark.
    """
    pieces: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        pieces += [(index, piece) for piece in _CLAUSE_END.split(line) if piece]
    return pieces


def join_pieces(pieces: Sequence[tuple[int, str]]) -> str:
    """Pieces back into lines: pieces of one line run on, lines are joined by a newline."""
    lines: list[str] = []
    last: int | None = None
    for index, piece in pieces:
        if index == last:
            lines[-1] += piece
        else:
            lines.append(piece)
            last = index
    return "\n".join(lines)


def system_text_with(base_text: str, guidance: str) -> str:
    """The system prompt as :func:`shaping.prompt.load_system_prompt` builds it with ``extra_guidance``."""
    return normalize_prompt(base_text + "\n" + guidance) if guidance else base_text


class GuidanceTooShort(Exception):
    """All the guidance text does not reach the next block boundary."""


@dataclass(frozen=True, slots=True)
class FilledPrefix:
    """The guidance that makes the shared prefix end on a whole block (or just past it)."""

    guidance: str  # pass to load_system_prompt(version, extra_guidance=...)
    system_text: str
    block_size: int
    base_shared_tokens: int  # the shared prefix without guidance
    shared_tokens: int  # with it
    target_tokens: int  # the block boundary aimed at

    @property
    def overshoot(self) -> int:
        """Shared tokens past the boundary: computed by every request (a piece cannot be split further)."""
        return self.shared_tokens - self.target_tokens

    @property
    def added_tokens(self) -> int:
        """Tokens the guidance adds to every request."""
        return self.shared_tokens - self.base_shared_tokens


class BlockFill:
    """Sans-IO search for the least guidance that fills the shared prefix to the next whole block.

    ``while (text := fill.next_candidate()) is not None: fill.record(text, measure(text))`` then
    ``fill.result()``; ``measure`` answers the shared-prefix tokens of a system prompt text on the engine.
    Binary search over guidance pieces (a token count grows with the text): about a dozen measurements.
    """

    def __init__(self, base_text: str, guidance_lines: Sequence[str], block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1 token, got {block_size}")
        self.base_text = base_text
        self.block_size = block_size
        self._pieces = guidance_pieces(guidance_lines)
        self._measured: dict[int, int] = {}  # pieces used -> shared-prefix tokens
        self._low = 0  # largest piece count known to fall short (0: none, measured first)
        self._high: int | None = None  # smallest piece count known to reach the target
        self._target: int | None = None

    def _text(self, count: int) -> str:
        return system_text_with(self.base_text, join_pieces(self._pieces[:count]))

    def _wanted(self) -> int | None:
        if 0 not in self._measured:
            return 0
        assert self._target is not None
        if self._high is None:
            total = len(self._pieces)
            if total not in self._measured:
                return total
            return None  # all of it falls short: result() says so
        if self._high - self._low <= 1:
            return None
        return (self._low + self._high) // 2

    def next_candidate(self) -> str | None:
        """The next system prompt to measure, or None when the search is over."""
        wanted = self._wanted()
        return None if wanted is None else self._text(wanted)

    def record(self, text: str, shared_tokens: int) -> None:
        """The shared-prefix tokens the engine counted for the last candidate."""
        wanted = self._wanted()
        if wanted is None or text != self._text(wanted):
            raise ValueError("record() must answer the candidate next_candidate() proposed")
        self._measured[wanted] = shared_tokens
        if wanted == 0:
            self._target = next_block_boundary(shared_tokens, self.block_size)
            if shared_tokens == self._target:
                self._high = 0  # already whole blocks: no guidance needed
            return
        assert self._target is not None
        if shared_tokens >= self._target:
            self._high = wanted
        else:
            self._low = wanted

    def result(self) -> FilledPrefix:
        """The filled prefix once :meth:`next_candidate` answered None."""
        if self._wanted() is not None or self._target is None:
            raise RuntimeError("the search is not finished: measure every candidate first")
        base = self._measured[0]
        if self._high is None:
            reached = self._measured[len(self._pieces)]
            raise GuidanceTooShort(
                f"all {len(self._pieces)} guidance pieces bring the shared prefix to {reached:,} tokens, "
                f"short of the {self._target:,}-token block boundary (block {self.block_size:,}): "
                "add policy text"
            )
        guidance = join_pieces(self._pieces[: self._high])
        return FilledPrefix(
            guidance=guidance,
            system_text=self._text(self._high),
            block_size=self.block_size,
            base_shared_tokens=base,
            shared_tokens=self._measured[self._high],
            target_tokens=self._target,
        )
