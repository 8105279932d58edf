"""Which text the verdict's grammar admits, read from its regex by partial matching (shaping.confidence)."""

from __future__ import annotations

import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from shaping.confidence import grammar_admits
from shaping.verdict import ACTIONS, MODEL_CATEGORIES, compact_regex, compact_text

ALPHABET = sorted({*"".join(ACTIONS), *"".join(MODEL_CATEGORIES), ":", ",", "\n", " ", "x", "A"})


def completion(pattern: str, text: str, budget: int = 2_000) -> str | None:
    """A full match of ``pattern`` that begins with ``text``, found by adding one character at a time where
    the grammar still admits it (``fullmatch`` without ``partial`` says when one is found), or None."""
    stack = [text]
    while stack and budget > 0:
        budget -= 1
        current = stack.pop()
        if regex.fullmatch(pattern, current) is not None:
            return current
        stack.extend(current + c for c in reversed(ALPHABET) if grammar_admits(pattern, current + c))
    return None


verdicts = st.one_of(
    st.sampled_from(["allow", "review"]),
    st.lists(st.sampled_from(MODEL_CATEGORIES), min_size=1, max_size=len(MODEL_CATEGORIES)).map(
        lambda names: compact_text("block", names)
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    frames=st.integers(min_value=1, max_value=3),
    lines=st.lists(verdicts, min_size=3, max_size=3),
    cut=st.integers(min_value=0, max_value=200),
    tail=st.text(alphabet=ALPHABET, max_size=3),
)
def test_every_text_the_regex_admits_begins_some_full_match(
    frames: int, lines: list[str], cut: int, tail: str
) -> None:
    pattern = compact_regex(frames)
    answer = "\n".join(lines[:frames])
    text = answer[: cut % (len(answer) + 1)] + tail
    assert grammar_admits(pattern, answer[: cut % (len(answer) + 1)])  # every prefix of an answer
    if grammar_admits(pattern, text):
        assert completion(pattern, text) is not None, text


def test_the_last_frame_admits_no_line_break_and_a_name_must_be_a_categorys() -> None:
    assert grammar_admits(compact_regex(1), "allow")
    assert not grammar_admits(compact_regex(1), "allow\n")
    assert grammar_admits(compact_regex(2), "allow\n")
    assert grammar_admits(compact_regex(1), "block:sexual")
    assert grammar_admits(compact_regex(1), "block:sexual/")
    assert not grammar_admits(compact_regex(1), "block:sexualx")
    assert not grammar_admits(compact_regex(1), " allow")
    assert not grammar_admits(compact_regex(1), "Allow")
