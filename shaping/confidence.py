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
all the mass. There a listed alternative is credited to an action only where the grammar the gateway sent
admits it at that place (``action_probabilities``); what it surely forbids (``Allow``, ``allowed``,
``blocked``) is left out; what it may or may not admit (`` allow`` where the chosen token has no leading
space) is credited to no action; both that and what the list left out count in the denominator:

    confidence = P(chosen action's admitted spellings)
                 / (P(admitted spellings of any action) + P(maybe admitted) + P(not listed))

``P(not listed)`` is 1 minus the listed alternatives' mass (the softmax is over the whole vocabulary). The
figure is a lower bound of the grammar-renormalised probability (the model's softmax over what the grammar
admits: what constrained decoding samples from); nothing a list can hold or leave out raises it above that.
Where the raw list gives every allowed spelling 0 in float, ``places`` may bring the distribution at a
verdict's first token as a probe read it after the engine's sampler chain (``EngineWire.place_probe``): the
grammar-renormalised one where the engine drew again under the grammar, read the same way (then exact).

Category scores, for a block: a lower bound of P(the engine writes ``block`` and then the category's whole
path): every token after ``block`` through the end of the name and the chance that the name stops there
(``sexual`` against ``sexual/minors``), so a colon counts the same whether the BPE gives it a token of its
own (``:`` ``viol``) or merges it with the name (``:self``). At each token on the path a listed alternative
that spells the rest of the path to its stop adds its probability. A category the verdict does not name
scores its path where a listed alternative spells it to the end; where none does its probability is
unknown and it is left out of ``category_scores`` (never 0). On a not-masked engine each token on the path
is its share of 1 minus the listed tokens the compact grammar surely forbids there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shaping.verdict import ACTIONS, MODEL_CATEGORIES, Action, KeyframeVerdict

THINK_END = "</think>"
RAW_ZERO = " has a probability above 0 in the engine's raw softmax"
"""How a not-masked verdict's note ends where nothing allowed had mass in float (a probe may read it)."""
_JSON_ACTION = re.compile(r'"verdict"\s*:\s*"')
_JSON_CATEGORIES = re.compile(r'"categories"\s*:\s*\[([^\]]*)\]')
_JSON_ITEM = re.compile(r'"([^"]*)"')


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: its text, its log-probability and the best alternatives at its position."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()  # (token, logprob), as the engine listed them

    @classmethod
    def from_wire(cls, entry: dict[str, Any]) -> TokenLogprob:
        """Read one entry of vLLM's ``logprobs.content`` list (a missing number reads as -inf)."""
        return cls(
            token=str(entry.get("token") or ""),
            logprob=_number(entry.get("logprob")),
            top=tuple(
                (str(alt.get("token") or ""), _number(alt.get("logprob")))
                for alt in entry.get("top_logprobs") or ()
                if isinstance(alt, dict)
            ),
        )

    def alternatives(self) -> list[tuple[str, float]]:
        """The listed alternatives plus the token itself (once, even when the list holds it too)."""
        seen: dict[str, float] = {}
        for text, logprob in ((self.token, self.logprob), *self.top):
            seen.setdefault(text, logprob)
        return list(seen.items())


def _number(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value):
        return float(value)
    return float("-inf")


def _probability(logprob: float) -> float:
    return math.exp(logprob) if logprob > -745 else 0.0  # exp underflows to 0 below that anyway


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


def _admitted_after(action: Action, tail: str, json_form: bool) -> bool | None:
    """Whether the grammar admits ``tail`` right after ``action`` at a verdict's place: True, False, or
    None where it depends on more than the action's own grammar (a second frame's line)."""
    if not tail:
        return True
    if json_form:
        return tail[0] == '"' or None
    if action == "block":
        if tail[0] != ":":
            return False
        name = tail[1:]
        return any(c.startswith(name) or name.startswith(c) for c in MODEL_CATEGORIES) or None
    return tail[0] == "\n" or False


def action_probabilities(
    spans: _Spans, offset: int, *, grammar_masked: bool = True, json_form: bool = False
) -> dict[Action, float] | None:
    """P(action) as the engine gives it at the verdict's first character: each action's listed spellings.

    Grammar-masked (vLLM): not normalised over the three: an action the list leaves out is unknown, not
    impossible, so the chosen action keeps its own probability (a lower bound where a spelling of it was cut
    off the list). Not masked (llama.cpp): an alternative is credited to an action only where the grammar
    admits it at that place: the same head as the chosen token (its leading whitespace included), then a
    piece of the action's word or the word and what the grammar lets follow it (``:`` and a category
    after ``block``, a line break after ``allow``). What the grammar surely forbids there (``Allow``,
    ``allowed``, ``blocked``) is left out; what it may or may not admit (`` allow`` where the chosen token
    has no leading space) is mass no action is credited with; both that and what the list left out count
    as admitted in the denominator, so the reading is a lower bound whatever is listed.
    """
    if not grammar_masked:
        return _admitted_action_probabilities(spans, offset, json_form)
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


def _admitted_action_probabilities(spans: _Spans, offset: int, json_form: bool) -> dict[Action, float] | None:
    """The not-masked reading of ``action_probabilities``: credited spellings over what may be admitted."""
    index = spans.at(offset)
    if index is None:
        return None
    head = spans.text[spans.starts[index] : spans.lead + offset]
    mass, uncertain = dict.fromkeys(ACTIONS, 0.0), 0.0
    for text, logprob in spans.tokens[index].alternatives():
        probability = _probability(logprob)
        rest = text[len(head) :] if text.startswith(head) else text
        if not text.startswith(head) or rest != rest.lstrip():
            # other whitespace before the word: the grammar may admit it at this place (line breaks after
            # ``</think>``) or not
            word = rest.lstrip()
            if word and any(word.startswith(a) or a.startswith(word) for a in ACTIONS):
                uncertain += probability
            continue
        if not rest:
            continue
        for action in ACTIONS:
            if action.startswith(rest):
                mass[action] += probability
            elif rest.startswith(action):
                admitted = _admitted_after(action, rest[len(action) :], json_form)
                if admitted:
                    mass[action] += probability
                elif admitted is None:
                    uncertain += probability
    credited = sum(mass.values())
    if credited <= 0:
        return None
    allowed = credited + uncertain + _unlisted(spans, offset)
    return {action: value / allowed for action, value in mass.items()}


def _place_probabilities(place: Sequence[tuple[str, float]]) -> dict[Action, float] | None:
    """P(action) from the probabilities at a verdict's first place as a probe read them (llama.cpp's
    ``post_sampling_probs``): renormalised over what the grammar admits where the engine drew again under
    it, else its raw softmax; either way read as not masked (credited spellings over what may be admitted
    and what is not listed), exact in the first case and a lower bound in the second."""
    if not place:
        return None
    top = tuple((token, math.log(p) if p > 0 else float("-inf")) for token, p in place)
    entry = TokenLogprob(top[0][0], top[0][1], top)
    return _admitted_action_probabilities(_Spans((entry,), [0], entry.token, 0), 0, json_form=False)


def place_read(place: Sequence[tuple[str, float]] | None) -> bool:
    """Whether a probe's list gives the grammar's actions any mass (else a draw the grammar allowed left the
    raw softmax there, which may list none of them: another draw may be read)."""
    probabilities = _place_probabilities(place) if place else None
    return probabilities is not None and sum(probabilities.values()) > 0


def _unlisted(spans: _Spans, offset: int) -> float:
    """The raw softmax's mass outside the list at the token holding ``offset`` (1 minus what is listed).

    On an engine whose probabilities are over the whole vocabulary (llama.cpp), a token the list left out
    may be one the grammar allows: counting all of it as allowed makes the renormalised reading a lower
    bound, as a top-k cut is on vLLM (it can read lower, never higher)."""
    index = spans.at(offset)
    if index is None:
        return 0.0
    listed = sum(_probability(logprob) for _text, logprob in spans.tokens[index].alternatives())
    return max(0.0, 1.0 - listed)


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


def _line_admits(written: str) -> bool:
    """Whether the compact line grammar may admit ``written`` (a verdict from its ``block`` on) at this
    place: False only where it surely does not (no colon, a name no category has, a blank in a name)."""
    if not written.startswith("block") or len(written) == len("block"):
        return True
    if written[len("block")] != ":":
        return False
    line, newline, _rest = written[len("block:") :].partition("\n")
    *done, last = line.split(",")
    if any(name not in MODEL_CATEGORIES for name in done):
        return False
    if newline:  # the line ended: what follows is the next frame's or the end, not judged here
        return last in MODEL_CATEGORIES
    return any(c.startswith(last) for c in MODEL_CATEGORIES)


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
    grammar_masked: bool
    json_form: bool

    def share(self, index: int, probability: float) -> float:
        """The engine's ``probability`` at token ``index`` as a lower bound of the grammar's there: as given
        where the engine masked its logits; else over 1 minus the listed tokens the grammar surely forbids
        there (the line form's; in JSON nothing is surely forbidden, so the raw figure is the bound)."""
        if self.grammar_masked:
            return probability
        origin = self.spans.lead + self.action
        if self.json_form or self.spans.starts[index] < origin:
            return probability
        written = self.spans.text[origin : self.spans.starts[index]]
        forbidden = sum(
            _probability(logprob)
            for text, logprob in self.spans.tokens[index].alternatives()
            if not _is_special(text) and not _line_admits(written + text)
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

    def probability(self, target: str) -> float:
        """A lower bound of P(the engine writes ``block``, then ``target``, and the name there ends).

        Along the chosen tokens while they spell ``target``; at each of them, every listed alternative that
        spells the rest of it through its end is added (the same text split another way, or the path the
        engine did not take). 0.0 where nothing listed reaches the end: the path's probability is unknown.
        """
        spans = self.spans
        after = spans.lead + self.action + len("block")
        first = spans.at(self.action)
        if first is None:
            return 0.0
        probability, total, index = self.p_block, 0.0, first
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
            return 0.0
        head = spans.text[spans.starts[index] : after] if spans.starts[index] < after else ""
        if head and index != first:  # a later piece of ``block`` goes on past it: its chosen spelling alone
            probability *= self.share(index, _probability(spans.tokens[index].logprob))
        while index < len(spans.tokens):
            token = spans.tokens[index]
            chosen = "" if _is_special(token.token) else token.token[len(head) :]
            if not head:
                for text, logprob in token.alternatives():
                    if text != token.token and (
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
    scores = {
        category: paths.probability(named.get(category, separator + category))
        for category in MODEL_CATEGORIES
    }
    # four significant digits, not four decimals: a path reached with a tiny probability keeps its (small)
    # lower bound, and only a path the logprobs do not reach (exactly 0.0) is left out as unknown
    return tuple((category, float(f"{score:.4g}")) for category, score in scores.items() if score > 0)


def unread_in_raw_softmax(verdict: KeyframeVerdict) -> bool:
    """Whether a verdict has no confidence only because the raw softmax gave its place nothing in float."""
    return verdict.confidence is None and (verdict.confidence_note or "").endswith(RAW_ZERO)


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
    places: Mapping[int, Sequence[tuple[str, float]]] | None = None,
) -> tuple[KeyframeVerdict, ...]:
    """The verdicts with ``confidence`` and ``category_scores`` read from the engine's logprobs.

    ``grammar_masked``: whether the engine's logprobs are taken over what the grammar allows (vLLM) or
    over the raw logits (llama.cpp), which are renormalised over the allowed alternatives and the mass the
    list left out. ``places``: for a verdict (by index), the (token, probability) list at its first token
    that a probe read after the engine's sampler chain (``EngineWire.place_probe``); its action is read
    from there instead of the answer's own list.

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
    read: list[KeyframeVerdict] = []
    for index, (verdict, offset) in enumerate(zip(verdicts, offsets, strict=True)):
        if verdict.problem is not None:
            read.append(replace(verdict, confidence=None, confidence_note="the verdict could not be parsed"))
            continue
        if places and index in places:
            probabilities = _place_probabilities(places[index])
        else:
            probabilities = action_probabilities(
                spans, offset, grammar_masked=grammar_masked, json_form=json_form
            )
        if probabilities is None:
            note = "no alternative at the verdict's first token" + (
                "" if grammar_masked else RAW_ZERO
            )
            read.append(replace(verdict, confidence=None, confidence_note=note))
            continue
        scores: tuple[tuple[str, float], ...] = ()  # another action: no category's path is reached
        if verdict.action == "block":
            paths = _BlockPaths(spans, offset, probabilities["block"], terminators, grammar_masked, json_form)
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
