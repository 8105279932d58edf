"""A decision question as the engine is asked it, and its answer's distribution read from log-probabilities.

Each question is one prompt: the request's shaped input (the same prefix for every question, so the engine
computes it once) and then the question, whose answer a grammar holds to the question's admitted answers:

- predicate: ``yes`` or ``no``; P(true) is P(``yes``);
- score: the level's index, one digit (``0`` the lowest level);
- choice: the option's value as text; a boolean as ``true``/``false``, or ``boolean true`` where a string
  option spells ``true`` too (values are typed: the two are different options).

The distribution is never read from text. At the answer's first place the engine lists its tokens with their
probabilities; a token the grammar admits there begins one or more answers. Where it begins one, its share
of the admitted mass is that answer's; where several answers share it (``viol`` of ``violence`` and
``violent``), the engine is asked again at the place after it (the answer so far sent as the assistant's
start) and the shares multiply, down the answers' common prefixes, until every path ends in one answer. At
every place the shares are over what the grammar admits there (normalised over the admitted answers), and a
place is read only where what the engine's list leaves out cannot move the shares past
:data:`shaping.confidence.EXACT_WITHIN`, the same honesty as the verdict's confidence: otherwise the
question has no distribution and says why (never a made-up 1.0).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from shaping.confidence import EXACT_WITHIN, grammar_admits, is_special

QuestionKind = Literal["predicate", "choice", "score"]
PREDICATE_LABELS: Final = ("yes", "no")
SKIP_BELOW: Final = 1e-9
"""A path less likely than this is not asked further: its mass is counted as unread (it cannot reach the
reading's last digit unless such paths add up past ``EXACT_WITHIN``)."""

SYSTEM_PROMPT: Final = (
    "You answer questions about the input exactly as asked, with one of the admitted answers and nothing "
    "else."
)


def option_labels(values: Sequence[str | bool]) -> tuple[str, ...]:
    """Each choice option's answer text, in order: a string as itself, a boolean as ``true``/``false`` (or
    ``boolean true`` where a string option already spells it)."""
    strings = {value for value in values if isinstance(value, str)}
    labels = []
    for value in values:
        if isinstance(value, bool):
            text = "true" if value else "false"
            labels.append(f"boolean {text}" if text in strings else text)
        else:
            labels.append(value)
    return tuple(labels)


def score_labels(levels: int) -> tuple[str, ...]:
    """A score's answers: each level's index, one digit each (at most ten levels)."""
    if not 2 <= levels <= 10:
        raise ValueError(f"a score has 2 to 10 levels, got {levels}")
    return tuple(str(index) for index in range(levels))


def question_text(
    kind: QuestionKind, labels: Sequence[str], descriptions: Sequence[str | None] = ()
) -> str:
    """What follows a question's instructions: the admitted answers and what each means."""
    if kind == "predicate":
        return "Is this statement true of the input? Answer yes or no."
    described = list(descriptions) + [None] * (len(labels) - len(descriptions))
    if kind == "score":
        lines = [f"{label}: {text}" for label, text in zip(labels, described, strict=True)]
        return "Rate the input on these levels, lowest first. Answer with the level's number.\n" + "\n".join(
            lines
        )
    lines = [
        label if text is None else f"{label}: {text}" for label, text in zip(labels, described, strict=True)
    ]
    return "Choose one of these options. Answer with the option exactly as written.\n" + "\n".join(lines)


def thought_then(thought: str, before: str) -> str:
    """The assistant's start for a place after a thought: the thought in the template's own block (Qwen3's
    ``<think>`` … ``</think>`` and the two line breaks it writes after it), then the answer so far."""
    return f"<think>\n{thought.strip()}\n</think>\n\n{before}"


def answers_regex(labels: Iterable[str], before: str = "") -> str:
    """The grammar of what may follow ``before``: the rest of each answer that starts with it (an empty rest:
    the output may end there)."""
    rests = sorted(
        {label[len(before) :] for label in labels if label.startswith(before)}, key=lambda r: (len(r), r)
    )
    if not rests:
        raise ValueError(f"no answer begins with {before!r}")
    alternatives = "(?:" + "|".join(_escaped(rest) for rest in rests if rest) + ")"
    # an answer that ends here: the rest is optional (no empty alternative, which not every engine's
    # regex grammar takes)
    return alternatives + "?" if "" in rests else alternatives


_METACHARACTERS: Final = frozenset("\\.^$*+?{}[]|()")


def _escaped(text: str) -> str:
    """``text`` as a regex literal: only the metacharacters escaped (``re.escape`` also escapes blanks and
    hyphens, which some engines' regex grammars refuse outside a class)."""
    return "".join("\\" + char if char in _METACHARACTERS else char for char in text)


@dataclass(frozen=True, slots=True)
class PlaceShares:
    """One place read: each admitted token's share of the admitted mass, by the answer it settles
    (``settled``) or by the longer answer-so-far it leaves several answers open after (``open``); or
    ``note``: why the place cannot be read."""

    settled: dict[str, float] = field(default_factory=dict)
    open: dict[str, float] = field(default_factory=dict)
    note: str | None = None


def place_shares(
    alternatives: Iterable[tuple[str, float]], before: str, labels: Sequence[str]
) -> PlaceShares:
    """Read one place after ``before`` from the engine's (token, probability) list there.

    Tokens the grammar forbids are dropped (an engine whose list is not grammar-masked lists them); the end
    of output counts where ``before`` is a whole answer. Exact only where the unlisted mass is at most
    ``EXACT_WITHIN`` of what may be admitted (the vLLM list under the grammar's mask lists every admitted
    token with mass when it has room, so the unlisted mass is what its top-k cut off).
    """
    pattern = answers_regex(labels, before)
    listed = admitted = 0.0
    settled: dict[str, float] = {}
    open_: dict[str, float] = {}
    for text, probability in alternatives:
        if probability <= 0:
            continue
        listed += probability
        end = is_special(text)  # the end of output: admitted where ``before`` is a whole answer
        if end and before not in labels:
            continue
        if not end and not grammar_admits(pattern, text):
            continue
        admitted += probability
        written = before if end else before + text
        after = [label for label in labels if label.startswith(written)]
        if end or len(after) == 1:
            key = written if end else after[0]
            settled[key] = settled.get(key, 0.0) + probability
        else:
            open_[written] = open_.get(written, 0.0) + probability
    unlisted = max(0.0, 1.0 - listed)
    if admitted <= 0:
        return PlaceShares(note="no token the grammar admits has a probability above 0 in the engine's list")
    if unlisted / (admitted + unlisted) > EXACT_WITHIN:
        return PlaceShares(
            note=f"the engine's list leaves {unlisted:.3g} of the mass out beside {admitted:.3g} the grammar "
                 f"admits, which could move the answer's probabilities"
        )
    return PlaceShares(
        {label: value / admitted for label, value in settled.items()},
        {written: value / admitted for written, value in open_.items()},
    )


@dataclass(frozen=True, slots=True)
class Distribution:
    """A question's answers' probabilities, in the question's order (summing to 1), or why there are none."""

    probabilities: tuple[float, ...] | None
    note: str | None = None
    places: int = 0  # the places read (engine calls that answered)

    def best(self) -> tuple[int, float]:
        """The most probable answer's index and its probability (the first of equals)."""
        assert self.probabilities is not None
        index = max(range(len(self.probabilities)), key=lambda i: (self.probabilities or ())[i])
        return index, self.probabilities[index]

    def expected_index(self) -> float:
        """The probability-weighted mean of the answers' indices (a score's ``score``)."""
        assert self.probabilities is not None
        return sum(index * p for index, p in enumerate(self.probabilities))


class DistributionWalk:
    """The places one question's distribution needs, asked one after another: :meth:`next_place` says where
    (the answer so far: ``""`` first), :meth:`record` takes the engine's list there."""

    def __init__(self, labels: Sequence[str], max_places: int) -> None:
        if len(set(labels)) != len(labels):
            raise ValueError("two answers are spelled alike")
        self.labels = tuple(labels)
        self.max_places = max_places
        self._mass = dict.fromkeys(self.labels, 0.0)
        self._todo: list[tuple[str, float]] = [("", 1.0)]
        self._unread = 0.0
        self._places = 0
        self._note: str | None = None

    def next_place(self) -> str | None:
        """The answer so far where the engine is to be asked next, or None when the walk is done."""
        while self._note is None and self._todo:
            before, weight = self._todo[0]
            if weight >= SKIP_BELOW:
                return before
            self._todo.pop(0)
            self._unread += weight
        return None

    def regex(self, before: str) -> str:
        """The grammar the engine holds the answer's rest to after ``before``."""
        return answers_regex(self.labels, before)

    def record(
        self, before: str, alternatives: Iterable[tuple[str, float]] | None, *, final: bool = True
    ) -> bool:
        """Take the engine's (token, probability) list at ``before`` (None: it gave none). A list that
        cannot be read ends the walk without a distribution, unless not ``final`` (another draw may read):
        then nothing is taken and False is answered."""
        if alternatives is None:
            if not final:
                return False
            self._note = "the engine returned no log-probabilities for the answer"
            return True
        shares = place_shares(alternatives, before, self.labels)
        if shares.note is not None and not final:
            return False
        position = next(i for i, (place, _) in enumerate(self._todo) if place == before)
        _, weight = self._todo.pop(position)
        self._places += 1
        if shares.note is not None:
            self._note = shares.note
            return True
        for label, share in shares.settled.items():
            self._mass[label] += weight * share
        self._todo.extend((written, weight * share) for written, share in shares.open.items())
        if self._todo and self._places >= self.max_places:
            self._note = f"the answers share first tokens past {self.max_places} places of the engine's"
        return True

    def fail(self, note: str) -> None:
        """End the walk without a distribution (the engine could not be asked)."""
        self._note = note

    def result(self) -> Distribution:
        """The distribution, normalised over the admitted answers, or why there is none."""
        if self._note is not None:
            return Distribution(None, self._note, self._places)
        if self._unread > EXACT_WITHIN:
            return Distribution(None, f"{self._unread:.3g} of the mass lies on paths too unlikely to ask",
                                self._places)
        total = sum(self._mass.values())
        if total <= 0:
            return Distribution(None, "no admitted answer has mass", self._places)
        return Distribution(tuple(self._mass[label] / total for label in self.labels), None, self._places)
