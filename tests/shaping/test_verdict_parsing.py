"""Verdict parsing: any engine output becomes verdicts, never an exception."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shaping.verdict import (
    MODEL_CATEGORIES,
    compact_regex,
    compact_text,
    parse_engine_output,
    verdict_regex,
)

GOOD = '{"verdict":"block","categories":["violence"],"confidence":0.92}'


def test_a_valid_verdict_is_read_as_sent() -> None:
    parsed = parse_engine_output(GOOD, None, "stop")
    (verdict,) = parsed.verdicts
    assert (verdict.action, verdict.categories, verdict.stated_confidence) == ("block", ("violence",), 0.92)
    assert verdict.confidence is None  # what the model wrote is not the confidence: logprobs are
    assert verdict.flagged
    assert parsed.problems == ()


def test_reasoning_is_kept_apart_from_the_answer() -> None:
    parsed = parse_engine_output(GOOD, "the frame shows a fight", "stop")
    assert parsed.reasoning == "the frame shows a fight"
    assert parsed.verdicts[0].action == "block"


def test_reasoning_leaked_into_content_is_split_off() -> None:
    parsed = parse_engine_output("<think>looks calm</think>\n" + GOOD, None, "stop")
    assert parsed.reasoning == "looks calm"
    assert parsed.verdicts[0].action == "block"


def test_a_closing_think_tag_without_its_opening_is_split_off() -> None:
    parsed = parse_engine_output("looks calm</think>" + GOOD, None, "stop")
    assert parsed.reasoning == "looks calm"
    assert parsed.verdicts[0].action == "block"


def test_a_truncated_answer_becomes_review_with_a_reason() -> None:
    parsed = parse_engine_output('{"verdict":"blo', None, "length")
    verdict = parsed.verdicts[0]
    assert verdict.action == "review"
    assert verdict.problem == "truncated_output"
    assert "max_completion_tokens" in verdict.detail


def test_empty_output_becomes_review() -> None:
    assert parse_engine_output(None, "only thoughts", "stop").verdicts[0].problem == "empty_output"


def test_prose_becomes_review() -> None:
    assert parse_engine_output("looks fine to me", None, "stop").verdicts[0].problem == "invalid_json"


def test_an_unknown_action_becomes_review() -> None:
    verdict = parse_engine_output(
        '{"verdict":"maybe","categories":[],"confidence":1}', None, "stop"
    ).verdicts[0]
    assert (verdict.action, verdict.problem) == ("review", "schema_mismatch")


def test_a_code_fenced_answer_is_accepted() -> None:
    assert parse_engine_output(f"```json\n{GOOD}\n```", None, "stop").verdicts[0].action == "block"


def test_packed_frames_give_one_verdict_each() -> None:
    content = json.dumps(
        {"frames": [json.loads(GOOD), {"verdict": "allow", "categories": [], "confidence": 0.9}]}
    )
    parsed = parse_engine_output(content, None, "stop", frames=2)
    assert [v.action for v in parsed.verdicts] == ["block", "allow"]


def test_a_packed_answer_with_the_wrong_count_is_review_for_every_frame() -> None:
    parsed = parse_engine_output(json.dumps({"frames": [json.loads(GOOD)]}), None, "stop", frames=3)
    assert [v.action for v in parsed.verdicts] == ["review"] * 3


def test_the_regex_constraint_accepts_every_schema_valid_compact_verdict() -> None:
    pattern = re.compile(verdict_regex())
    assert pattern.fullmatch(GOOD)
    assert pattern.fullmatch('{"verdict":"allow","categories":[],"confidence":1.0}')
    assert not pattern.fullmatch('{"verdict":"allow","categories":["weather"],"confidence":0.5}')


@given(
    st.text(max_size=300),
    st.one_of(st.none(), st.text(max_size=50)),
    st.sampled_from([None, "stop", "length", "abort"]),
    st.integers(min_value=1, max_value=4),
)
def test_any_output_parses_without_raising(
    content: str, reasoning: str | None, finish: str | None, frames: int
) -> None:
    parsed = parse_engine_output(content, reasoning, finish, frames=frames)
    assert len(parsed.verdicts) == frames
    assert all(v.action in ("allow", "review", "block") for v in parsed.verdicts)


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
    )
)
def test_any_json_value_parses_without_raising(value: object) -> None:
    verdict = parse_engine_output(json.dumps(value), None, "stop").verdicts[0]
    assert verdict.action in ("allow", "review", "block")
    if verdict.problem is None:
        assert set(verdict.categories) <= set(MODEL_CATEGORIES)


# --- the compact verdict -----------------------------------------------------------------------------------


def test_a_compact_allow_and_review_are_read_as_sent() -> None:
    for text in ("allow", "review"):
        (verdict,) = parse_engine_output(text, None, "stop").verdicts
        assert (verdict.action, verdict.categories, verdict.problem) == (text, (), None)
        assert verdict.verdict_format == "compact"


def test_a_compact_block_names_its_categories_in_order_once_each() -> None:
    (verdict,) = parse_engine_output("block:violence,hate,violence", None, "stop").verdicts
    assert (verdict.action, verdict.categories, verdict.problem) == ("block", ("violence", "hate"), None)


def test_a_compact_verdict_after_leaked_reasoning_is_read() -> None:
    parsed = parse_engine_output("looks violent</think>\n\nblock:violence/graphic", None, "stop")
    assert parsed.reasoning == "looks violent"
    assert parsed.verdicts[0].categories == ("violence/graphic",)


@pytest.mark.parametrize(
    ("text", "finish"),
    [
        ("block:", "stop"),  # no category
        ("block:weather", "stop"),  # not in the vocabulary
        ("blocked", "stop"),  # not the form at all: read as (bad) JSON
        ("allow\nallow", "stop"),  # two verdicts for one frame
        ("block:viol", "length"),  # cut by the token limit
        ("al", "length"),
    ],
)
def test_an_unusable_compact_verdict_becomes_review_with_a_reason(text: str, finish: str) -> None:
    (verdict,) = parse_engine_output(text, None, finish).verdicts
    assert verdict.action == "review"
    assert verdict.problem is not None
    assert verdict.detail


def test_packed_compact_verdicts_are_one_line_per_frame() -> None:
    parsed = parse_engine_output("allow\nblock:sexual\nreview", None, "stop", frames=3)
    assert [(v.action, v.categories) for v in parsed.verdicts] == [
        ("allow", ()),
        ("block", ("sexual",)),
        ("review", ()),
    ]
    assert parse_engine_output("allow\nreview", None, "stop", frames=3).problems == ("invalid_compact",)


def test_the_compact_grammar_is_exactly_the_compact_forms() -> None:
    pattern = re.compile(compact_regex())
    assert all(re.fullmatch(r"[a-z/-]+", name) for name in MODEL_CATEGORIES)  # nothing needs escaping
    for name in MODEL_CATEGORIES:
        assert pattern.fullmatch(compact_text("block", (name,)))
    assert pattern.fullmatch("allow")
    assert pattern.fullmatch("review")
    assert pattern.fullmatch("block:" + ",".join(MODEL_CATEGORIES))
    for wrong in ("block", "block:", "allow:violence", "Allow", " allow", "allow\n", "block:violence,", "{}"):
        assert not pattern.fullmatch(wrong), wrong
    assert re.compile(compact_regex(2)).fullmatch("allow\nblock:hate")
    assert not re.compile(compact_regex(2)).fullmatch("allow")


@given(st.lists(st.sampled_from(MODEL_CATEGORIES), min_size=1, max_size=len(MODEL_CATEGORIES), unique=True))
def test_any_compact_block_matches_the_grammar_and_reads_back(names: list[str]) -> None:
    text = compact_text("block", names)
    assert re.fullmatch(compact_regex(), text)
    (verdict,) = parse_engine_output(text, None, "stop").verdicts
    assert (verdict.action, list(verdict.categories), verdict.problem) == ("block", names, None)
