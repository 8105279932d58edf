"""A verdict's confidence read from the engine's log-probabilities, not from a number the model writes.

The engine returns, for every generated token, its log-probability and the ``top_logprobs`` best
alternatives at that position (vLLM: ``choices[0].logprobs.content[{token, logprob, bytes, top_logprobs}]``,
streamed one delta at a time). The confidence is the chosen action's own probability as the engine gives it
at the verdict's first token:

    confidence = P(chosen action) = sum of P(token) over the chosen token and the listed alternatives
                                    that spell the same action another way

Other spellings are a shorter or longer first piece (``bl`` for ``block``) or the same word with leading
whitespace (`` allow``); the three actions start with different letters, so every alternative begins at
most one action. Nothing is renormalised: under a grammar vLLM's log-probabilities are already taken over
what the grammar allows (the bitmask is applied to the logits before they are read, docs/verdict-format.md),
so the sum over the allowed tokens is 1 and the chosen action's share is its probability. A top-k cut can
only leave a spelling out, which makes the confidence lower, never higher: with ``top_logprobs`` 1 a true
0.5 reads 0.5 (it read 1.0 when the three actions were normalised over what was listed).

An engine whose log-probabilities are not grammar-masked (llama.cpp's ``llama-server``: a softmax over the
raw logits, ``grammar_masked=False``) lists tokens the grammar forbids and gives the allowed ones less than
all the mass. There the confidence is one thing: the model's probability of the verdict's first token among
what the grammar admits (what constrained decoding samples from), exact or null with the reason:

    confidence = P(admitted tokens that begin the chosen action) / P(admitted tokens)

Which tokens the grammar admits comes from the grammar itself: the regex the engine's grammar was made from
(``grammar``), partially matched (the ``regex`` package's ``partial=True``) against the text generated so
far and the candidate. What the list leaves out (1 minus what it lists: the probabilities are over the whole
vocabulary, the raw softmax's or, after llama.cpp redrew under the grammar, the grammar's) may be admitted,
so the reading is exact only where that mass cannot move it past the field's last digit
(``EXACT_WITHIN``); else the confidence is null and ``confidence_note`` starts with a code
(``UNLISTED_MASS``, ``NOTHING_ADMITTED``, ...) a probe may fix (``EngineWire.place_probe``: the grammar's
distribution at the verdict's first token, read the same way from ``places``).

Category scores, for a block: a lower bound of P(the engine writes ``block`` and then the category's whole
path): every token after ``block`` through the end of the name and the chance that the name stops there
(``sexual`` against ``sexual/minors``), so a colon counts the same whether the BPE gives it a token of its
own (``:`` ``viol``) or merges it with the name (``:self``). At each token on the path a listed alternative
that spells the rest of the path to its stop adds its probability. A category the verdict does not name
scores its path where a listed alternative spells it to the end; where none does its probability is
unknown and it is left out of ``category_scores`` (never 0). On a not-masked engine each token on the path
is its share of 1 minus the listed tokens the grammar forbids there (a lower bound: the unlisted mass counts
as admitted).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import regex

from shaping.verdict import ACTIONS, MODEL_CATEGORIES, Action, KeyframeVerdict

THINK_END = "</think>"
EXACT_WITHIN: Final = 5e-5
"""The most the unlisted (or uncommitted) mass may move a not-masked reading for it to be exact: half the
last of the four decimals the field carries."""

# Why a not-masked verdict's confidence is null: the note's first word (the rest says it for a reader)
NOTHING_ADMITTED: Final = "nothing_admitted"  # no listed token the grammar admits has mass in float
UNLISTED_MASS: Final = "unlisted_mass"  # what the list leaves out could move the reading past EXACT_WITHIN
UNCOMMITTED: Final = "uncommitted"  # admitted tokens that name no action yet (a line break) carry mass
NO_GRAMMAR: Final = "no_grammar"  # no regex to tell what the engine's grammar admits (a JSON schema)
PROBE_MAY_READ: Final = frozenset({NOTHING_ADMITTED, UNLISTED_MASS, UNCOMMITTED})
"""The notes a probe at the verdict's first token (the grammar's distribution, a list of its own) may fix."""
_JSON_ACTION = re.compile(r'"verdict"\s*:\s*"')
_JSON_CATEGORIES = re.compile(r'"categories"\s*:\s*\[([^\]]*)\]')
_JSON_ITEM = re.compile(r'"([^"]*)"')


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: its text, its log-probability and the best alternatives at its position."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()  # (token, logprob), as the engine listed them
    # ``alternatives()`` made once: a verdict's few tokens are each read for every category's path
    _alternatives: tuple[tuple[str, float], ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @classmethod
    def from_wire(cls, entry: dict[str, Any]) -> TokenLogprob:
        """Read one entry of vLLM's ``logprobs.content`` list (a missing number reads as -inf)."""
        return cls(
            token=str(entry.get("token") or ""),
            logprob=_number(entry.get("logprob")),
            top=tuple([
                (str(alt.get("token") or ""), _number(alt.get("logprob")))
                for alt in entry.get("top_logprobs") or ()
                if isinstance(alt, dict)
            ]),
        )

    def alternatives(self) -> tuple[tuple[str, float], ...]:
        """The listed alternatives plus the token itself (once, even when the list holds it too)."""
        alternatives = self._alternatives
        if alternatives is None:
            seen: dict[str, float] = {}
            for text, logprob in ((self.token, self.logprob), *self.top):
                seen.setdefault(text, logprob)
            alternatives = tuple(seen.items())
            object.__setattr__(self, "_alternatives", alternatives)  # frozen: set once, as made
        return alternatives


def _number(value: object) -> float:
    if type(value) is float and not math.isnan(value):  # the usual case, as JSON gives them
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value):
        return float(value)
    return float("-inf")


def _probability(logprob: float) -> float:
    return math.exp(logprob) if logprob > -745 else 0.0  # exp underflows to 0 below that anyway


probability = _probability  # public: a log-probability as a probability, as the readings here take it


@dataclass(frozen=True, slots=True)
class _Spans:
    """The answer's tokens laid end to end: where each starts in ``text``."""

    tokens: Sequence[TokenLogprob]
    starts: list[int]
    text: str
    lead: int  # characters of leading whitespace before the answer proper

    def at(self, offset: int) -> int | None:
        """Index of the token that holds the character at ``offset`` of the answer proper."""
        absolute = self.lead + offset
        for index in range(len(self.tokens)):
            end = self.starts[index + 1] if index + 1 < len(self.starts) else len(self.text)
            if self.starts[index] <= absolute < end:
                return index
        return None


def _is_special(token: str) -> bool:
    """A token that writes no text of the answer: empty (a stop token), ``</think>`` or ``<|…|>``."""
    return not token or token == THINK_END or (token.startswith("<|") and token.endswith("|>"))


is_special = _is_special  # public: the decision walk (shaping/decisions.py) reads an end of output alike


def _is_marker(token: str) -> bool:
    """A token that may trail the answer: special, or whitespace only."""
    return _is_special(token.strip())


def _answer_spans(logprobs: Sequence[TokenLogprob], answer: str) -> _Spans | None:
    """The answer's tokens, found from the end (the reasoning before them, if any, is not needed and a
    streamed answer may lack the token that closed it); None when the tokens do not spell the answer."""
    end = len(logprobs)
    while end > 0 and _is_marker(logprobs[end - 1].token):
        end -= 1
    text, start = "", end
    while start > 0 and len(text.lstrip()) < len(answer):
        start -= 1
        text = logprobs[start].token + text
    if not answer or text.lstrip() != answer:
        return None
    # the stop token stays in the spans: it is where the last name's ending is weighed
    tokens = logprobs[start:]
    starts, position = [], 0
    for entry in tokens:
        starts.append(position)
        position += 0 if _is_special(entry.token) else len(entry.token)
    full = "".join("" if _is_special(entry.token) else entry.token for entry in tokens)
    return _Spans(tokens, starts, full, len(full) - len(full.lstrip()))


def answer_start(logprobs: Sequence[TokenLogprob], answer: str) -> int | None:
    """The index of the token holding the answer's first character, found from the end (the thought before
    it is not needed); None when the tokens do not spell the answer."""
    spans = _answer_spans(logprobs, answer.strip())
    first = None if spans is None else spans.at(0)
    return None if spans is None or first is None else len(logprobs) - len(spans.tokens) + first


def _continuations(spans: _Spans, offset: int, *, spaced: bool = False) -> list[tuple[str, float]] | None:
    """The alternatives at the token holding ``offset``, each cut to what it writes from ``offset`` on.

    A token may start before ``offset`` (``":"al``, ``:self``): alternatives that do not share that head are
    impossible there and dropped; an alternative that ends exactly at ``offset`` says nothing of what
    follows and is dropped too. ``spaced``: where the head is only whitespace (a verdict's first token),
    leading whitespace is not part of the spelling, so `` allow`` and ``allow`` both write ``allow``.
    """
    index = spans.at(offset)
    if index is None:
        return None
    head = spans.text[spans.starts[index] : spans.lead + offset]
    loose = spaced and not head.strip()
    cut = []
    for text, logprob in spans.tokens[index].alternatives():
        if loose:
            if text.strip():
                cut.append((text.lstrip(), _probability(logprob)))
        elif text.startswith(head) and len(text) > len(head):
            cut.append((text[len(head) :], _probability(logprob)))
    return cut


def action_probabilities(spans: _Spans, offset: int) -> dict[Action, float] | None:
    """P(action) as a grammar-masked engine (vLLM) gives it at the verdict's first character: each action's
    listed spellings, not normalised over the three: an action the list leaves out is unknown, not
    impossible, so the chosen action keeps its own probability (a lower bound where a spelling of it was cut
    off the list)."""
    continuations = _continuations(spans, offset, spaced=True)
    if continuations is None:
        return None
    mass = dict.fromkeys(ACTIONS, 0.0)
    for rest, probability in continuations:
        for action in ACTIONS:
            if rest.startswith(action) or action.startswith(rest):
                mass[action] += probability
                break
    allowed = sum(mass.values())
    if allowed <= 0:
        return None
    return {action: min(1.0, value) for action, value in mass.items()}


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> regex.Pattern[str]:
    return regex.compile(pattern)


def grammar_admits(pattern: str, text: str) -> bool:
    """Whether the grammar made from ``pattern`` lets the output begin with ``text`` (partial matching)."""
    return _compiled(pattern).fullmatch(text, partial=True) is not None


def _grammar_ends(pattern: str, text: str) -> bool:
    """Whether the grammar lets the output end after ``text`` (the end-of-output token is admitted there)."""
    return _compiled(pattern).fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class PlaceReading:
    """A not-masked reading at a verdict's first token: each action's exact probability, or why none."""

    probabilities: dict[Action, float] | None
    note: str | None = None


def read_place(
    alternatives: Iterable[tuple[str, float]], prefix: str, head: str, pattern: str
) -> PlaceReading:
    """P(action) among what the grammar admits after ``prefix``, from (token, probability) pairs over the
    whole vocabulary (the raw softmax's best, or llama.cpp's list after it redrew under the grammar).

    ``head``: what the chosen token writes before the verdict's first character (a blank, a line break): an
    admitted token that writes it and then a letter begins that letter's action; one that writes no letter
    names no action yet (``UNCOMMITTED``). Exact where the unlisted and uncommitted mass together are at most
    ``EXACT_WITHIN`` of what may be admitted: then the tokens it could hold cannot move the fourth decimal.
    """
    listed = admitted = uncommitted = 0.0
    mass = dict.fromkeys(ACTIONS, 0.0)
    for text, probability in alternatives:
        listed += probability
        if probability <= 0:
            continue
        if _is_special(text):  # the end of output where the grammar may end there; other specials never
            if text or not _grammar_ends(pattern, prefix):
                continue
        elif not grammar_admits(pattern, prefix + text):
            continue
        admitted += probability
        rest = text[len(head) :] if text.startswith(head) else ""
        action = next((a for a in ACTIONS if rest[:1] == a[0]), None)
        if action is None:
            uncommitted += probability
        else:
            mass[action] += probability
    unlisted = max(0.0, 1.0 - listed)
    if admitted <= 0:
        return PlaceReading(None, f"{NOTHING_ADMITTED}: no token the grammar admits at the verdict's first "
                                  f"place has a probability above 0 in the engine's list")
    if (unlisted + uncommitted) / (admitted + unlisted) > EXACT_WITHIN:
        if unlisted >= uncommitted:
            return PlaceReading(None, f"{UNLISTED_MASS}: the engine's list leaves {unlisted:.3g} of the mass "
                                      f"out beside {admitted:.3g} the grammar admits, which could move it")
        return PlaceReading(
            None, f"{UNCOMMITTED}: {uncommitted:.3g} of the admitted mass names no action yet"
        )
    return PlaceReading({action: value / admitted for action, value in mass.items()})


def _place_reading(spans: _Spans, offset: int, blanks: str, pattern: str) -> PlaceReading:
    """:func:`read_place` on the answer's own list at the token holding the verdict's first character
    (``blanks``: what was generated after the thought and before the answer's tokens)."""
    index = spans.at(offset)
    if index is None:
        return PlaceReading(None, "the engine's logprob tokens do not reach the verdict")
    prefix = blanks + spans.text[: spans.starts[index]]
    head = spans.text[spans.starts[index] : spans.lead + offset]
    alternatives = ((text, _probability(logprob)) for text, logprob in spans.tokens[index].alternatives())
    return read_place(alternatives, prefix, head, pattern)


def place_exact(place: Sequence[tuple[str, float]] | None, before: str, pattern: str) -> bool:
    """Whether a probe's list gives the verdict after ``before`` an exact confidence."""
    return bool(place) and read_place(place or (), before, "", pattern).probabilities is not None


def _category_slots(answer: str, action_offset: int, json_form: bool) -> list[tuple[int, str]]:
    """(offset, category) of each category the verdict names, in order."""
    if json_form:
        found = _JSON_CATEGORIES.search(answer, action_offset)
        if found is None:
            return []
        return [(found.start(1) + m.start(1), m.group(1)) for m in _JSON_ITEM.finditer(found.group(1))]
    line_end = answer.find("\n", action_offset)
    line = answer[action_offset : len(answer) if line_end < 0 else line_end]
    if not line.startswith("block:"):
        return []
    slots, position = [], action_offset + len("block:")
    for name in line[len("block:") :].split(","):
        slots.append((position, name))
        position += len(name) + 1
    return slots


def _complete(target: str) -> bool:
    """Whether the grammar must end the category ``target`` ends with (no longer category begins with it)."""
    name = re.split(r'[:,"]', target)[-1]
    return name in MODEL_CATEGORIES and not any(c != name and c.startswith(name) for c in MODEL_CATEGORIES)


@dataclass(frozen=True, slots=True)
class _BlockPaths:
    """The verdict's tokens after its ``block``, where every category's path is read."""

    spans: _Spans
    action: int  # offset of the verdict's ``block`` in the answer proper
    p_block: float
    terminators: str
    json_form: bool
    grammar: str | None  # not masked: the regex the engine's grammar holds the answer to (None: masked)
    pre: str = ""  # what the grammar saw before the answer's tokens (blanks after the thought)

    def share(self, index: int, probability: float) -> float:
        """The engine's ``probability`` at token ``index`` as a lower bound of the grammar's there: as given
        where the engine masked its logits (or no grammar is known); else over 1 minus the listed tokens the
        grammar forbids there."""
        if self.grammar is None:
            return probability
        written = self.pre + self.spans.text[: self.spans.starts[index]]
        forbidden = sum(
            _probability(logprob)
            for text, logprob in self.spans.tokens[index].alternatives()
            if not _is_special(text) and not grammar_admits(self.grammar, written + text)
        )
        return min(1.0, probability / (1.0 - forbidden)) if forbidden < 1.0 else 0.0

    def ends(self, index: int) -> float:
        """P(a name that ends where token ``index`` starts stops there): its alternatives that stop it (a
        terminator, the end of output); 1.0 where the answer ended there with no token at all."""
        if index >= len(self.spans.tokens):
            return 1.0
        return sum(
            self.share(index, _probability(logprob))
            for text, logprob in self.spans.tokens[index].alternatives()
            if _is_special(text) or text[0] in self.terminators
        )

    def stops(self, rest: str, target: str) -> bool:
        """Whether a token that writes ``rest`` writes all of ``target`` and then stops its name."""
        return rest.startswith(target) and len(rest) > len(target) and rest[len(target)] in self.terminators

    def after_block(self) -> tuple[float, int, str] | None:
        """Where every category's path starts: P(the engine writes ``block``) along its tokens, the index of
        the token after them, and what of that token still spells ``block`` (None: the logprobs do not
        reach past it). The same for every category, so read once."""
        spans = self.spans
        after = spans.lead + self.action + len("block")
        first = spans.at(self.action)
        if first is None:
            return None
        probability, index = self.p_block, first
        if _token_end(spans, first) <= after:  # P(block) holds the first token; the rest of ``block``:
            index += 1
            while index < len(spans.tokens) and _token_end(spans, index) <= after:
                probability *= self.share(index, _probability(spans.tokens[index].logprob))
                index += 1
        else:  # ``block`` shares its first token with what follows: that spelling's share of P(block)
            spelled = sum(
                p for rest, p in _continuations(spans, self.action, spaced=True) or ()
                if rest.startswith("block") or "block".startswith(rest)
            )
            probability *= _probability(spans.tokens[first].logprob) / spelled if spelled > 0 else 0.0
        if index >= len(spans.tokens):
            return None
        head = spans.text[spans.starts[index] : after] if spans.starts[index] < after else ""
        if head and index != first:  # a later piece of ``block`` goes on past it: its chosen spelling alone
            probability *= self.share(index, _probability(spans.tokens[index].logprob))
        return probability, index, head

    def probability(self, target: str, start: tuple[float, int, str] | None) -> float:
        """A lower bound of P(the engine writes ``block``, then ``target``, and the name there ends), from
        ``start`` (:meth:`after_block`).

        Along the chosen tokens while they spell ``target``; at each of them, every listed alternative that
        spells the rest of it through its end is added (the same text split another way, or the path the
        engine did not take). 0.0 where nothing listed reaches the end: the path's probability is unknown.
        """
        if start is None:
            return 0.0
        spans = self.spans
        probability, index, head = start
        total = 0.0
        while index < len(spans.tokens):
            token = spans.tokens[index]
            chosen = "" if _is_special(token.token) else token.token[len(head) :]
            if not head:
                for text, logprob in token.alternatives():
                    # both ways an alternative reaches the end begin with ``target`` (most do not: test first)
                    if text.startswith(target) and text != token.token and (
                        self.stops(text, target) or (text == target and _complete(target))
                    ):
                        total += probability * self.share(index, _probability(logprob))
                probability *= self.share(index, _probability(token.logprob))
            if not chosen or not (target.startswith(chosen) or chosen.startswith(target)):
                return total
            if len(chosen) >= len(target):
                ended = self.stops(chosen, target) if len(chosen) > len(target) else self.ends(index + 1)
                return total + probability * ended
            target, head, index = target[len(chosen) :], "", index + 1
        return total


def _token_end(spans: _Spans, index: int) -> int:
    """Where token ``index`` ends in ``spans.text``."""
    return spans.starts[index + 1] if index + 1 < len(spans.starts) else len(spans.text)


def _category_scores(
    paths: _BlockPaths, answer: str, slots: list[tuple[int, str]]
) -> tuple[tuple[str, float], ...]:
    """Each category's score: a lower bound of P(block, then its path), read the same way whatever the
    tokenizer splits; a category whose path the logprobs do not reach (scored 0.0) is left out: unknown."""
    after = paths.action + len("block")
    if slots:  # a named category: the verdict as written up to its end; an unnamed one: in the first's place
        separator = answer[after : slots[0][0]]
        named = {name: answer[after : offset + len(name)] for offset, name in slots}
    else:
        separator, named = (',"categories":["' if paths.json_form else ":"), {}
    start = paths.after_block()
    scores = {
        category: paths.probability(named.get(category, separator + category), start)
        for category in MODEL_CATEGORIES
    }
    # four significant digits, not four decimals: a path reached with a tiny probability keeps its (small)
    # lower bound, and only a path the logprobs do not reach (exactly 0.0) is left out as unknown
    return tuple((category, float(f"{score:.4g}")) for category, score in scores.items() if score > 0)


def probe_may_read(verdict: KeyframeVerdict) -> bool:
    """Whether a verdict has no confidence for a reason the grammar's own list at its place may fix."""
    code = (verdict.confidence_note or "").partition(":")[0]
    return verdict.confidence is None and code in PROBE_MAY_READ


def _grammar_seen_before(logprobs: Sequence[TokenLogprob], start: int) -> str:
    """The blanks generated between the thought's end (or the output's start) and the answer's tokens."""
    blanks = ""
    while start > 0 and not logprobs[start - 1].token.strip() and logprobs[start - 1].token:
        start -= 1
        blanks = logprobs[start].token + blanks
    return blanks


def answer_before_each(content: str | None) -> list[str]:
    """The compact answer up to each verdict's first character (earlier frames' lines and their breaks)."""
    answer = (content or "").strip()
    return [answer[:offset] for offset in _action_offsets(answer, json_form=False)]


def _action_offsets(answer: str, json_form: bool) -> list[int]:
    if json_form:
        return [m.end() for m in _JSON_ACTION.finditer(answer)]
    offsets, position = [], 0
    for line in answer.split("\n"):
        if line.strip():
            offsets.append(position + len(line) - len(line.lstrip()))
        position += len(line) + 1
    return offsets


def with_confidence(
    verdicts: Iterable[KeyframeVerdict],
    logprobs: Sequence[TokenLogprob] | None,
    content: str | None,
    missing: str = "the engine returned no logprobs",
    *,
    grammar_masked: bool = True,
    grammar: str | None = None,
    places: Mapping[int, Sequence[tuple[str, float]]] | None = None,
) -> tuple[KeyframeVerdict, ...]:
    """The verdicts with ``confidence`` and ``category_scores`` read from the engine's logprobs.

    ``grammar_masked``: whether the engine's logprobs are taken over what the grammar allows (vLLM) or
    over the raw logits (llama.cpp), read exactly over what ``grammar`` (the regex the engine's grammar
    holds the answer to) admits, or null with the reason. ``places``: for a verdict (by index), the
    (token, probability) list at its first token that a probe read after the engine's sampler chain
    (``EngineWire.place_probe``); its action is read from there where the answer's own list cannot say.

    Verdicts that could not be parsed, or whose tokens the logprobs do not cover, keep ``confidence``
    None with a note that says why (``missing`` when there are no logprobs at all).
    """
    verdicts = tuple(verdicts)

    def unread(note: str) -> tuple[KeyframeVerdict, ...]:
        unparsed = "the verdict could not be parsed"
        return tuple(
            replace(v, confidence=None, confidence_note=unparsed if v.problem else note) for v in verdicts
        )

    if all(v.problem for v in verdicts):
        return unread("")
    if logprobs is None:
        return unread(missing)
    answer = (content or "").strip()
    if "</think>" in answer:  # reasoning leaked into content: the answer is what follows it
        answer = answer.rpartition("</think>")[2].strip()
    spans = _answer_spans(logprobs, answer)
    if spans is None:
        return unread("the engine's logprob tokens do not spell its answer")
    json_form = answer.startswith("{")
    offsets = _action_offsets(answer, json_form)
    if len(offsets) != len(verdicts):
        return unread(f"found {len(offsets)} verdicts in the logprobs for {len(verdicts)} frames")
    terminators = '"' if json_form else ",\n"
    blanks = _grammar_seen_before(logprobs, len(logprobs) - len(spans.tokens))
    read: list[KeyframeVerdict] = []
    for index, (verdict, offset) in enumerate(zip(verdicts, offsets, strict=True)):
        if verdict.problem is not None:
            read.append(replace(verdict, confidence=None, confidence_note="the verdict could not be parsed"))
            continue
        note = "no alternative at the verdict's first token"
        if grammar_masked:
            probabilities = action_probabilities(spans, offset)
        elif grammar is None:
            probabilities, note = None, f"{NO_GRAMMAR}: no regex tells what the engine's grammar admits"
        else:
            reading = _place_reading(spans, offset, blanks, grammar)
            if reading.probabilities is None and places and index in places:
                before = blanks + spans.text[: spans.lead] + answer[:offset]
                reading = read_place(places[index], before, "", grammar)
            probabilities, note = reading.probabilities, reading.note or note
        if probabilities is None:
            read.append(replace(verdict, confidence=None, confidence_note=note))
            continue
        scores: tuple[tuple[str, float], ...] = ()  # another action: no category's path is reached
        if verdict.action == "block":
            paths = _BlockPaths(
                spans, offset, probabilities["block"], terminators, json_form,
                None if grammar_masked else grammar, blanks,
            )
            scores = _category_scores(paths, answer, _category_slots(answer, offset, json_form))
        read.append(
            replace(
                verdict,
                confidence=round(probabilities[verdict.action], 4),
                category_scores=scores,
                confidence_note=None,
            )
        )
    return tuple(read)
