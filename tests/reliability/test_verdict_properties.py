"""Properties of verdict parsing the shaping tests do not state: what the schema allows survives parsing
unchanged, and hostile output (truncation, NaN, deep nesting, stray reasoning) always ends as ``review``."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shaping.verdict import ACTIONS, MODEL_CATEGORIES, parse_engine_output, verdict_regex

verdicts = st.fixed_dictionaries(
    {
        "verdict": st.sampled_from(ACTIONS),
        "categories": st.lists(
            st.sampled_from(MODEL_CATEGORIES), max_size=len(MODEL_CATEGORIES), unique=True
        ),
        "confidence": st.floats(min_value=0, max_value=1, allow_nan=False),
    }
)


@given(verdicts)
def test_a_schema_valid_verdict_is_read_back_unchanged(verdict: dict[str, Any]) -> None:
    (parsed,) = parse_engine_output(json.dumps(verdict), None, "stop").verdicts
    assert parsed.problem is None
    assert (parsed.action, list(parsed.categories), parsed.stated_confidence) == (
        verdict["verdict"],
        verdict["categories"],
        verdict["confidence"],
    )
    assert parsed.flagged == (verdict["verdict"] != "allow")


@given(verdicts, st.text(max_size=200).filter(lambda t: "</think>" not in t and "<think>" not in t))
def test_reasoning_leaked_before_a_verdict_never_changes_it(verdict: dict[str, Any], thoughts: str) -> None:
    plain = parse_engine_output(json.dumps(verdict), None, "stop").verdicts[0]
    leaked = parse_engine_output(f"<think>{thoughts}</think>\n{json.dumps(verdict)}", None, "stop")
    assert leaked.verdicts[0] == plain


@given(verdicts)
def test_any_verdict_cut_by_the_token_limit_is_review(verdict: dict[str, Any]) -> None:
    (parsed,) = parse_engine_output(json.dumps(verdict), None, "length").verdicts
    assert (parsed.action, parsed.problem) == ("review", "truncated_output")


@given(st.lists(verdicts, min_size=2, max_size=6))  # one frame is answered unpacked
def test_packed_verdicts_come_back_one_per_frame_in_order(frames: list[dict[str, Any]]) -> None:
    parsed = parse_engine_output(json.dumps({"frames": frames}), None, "stop", frames=len(frames))
    assert [v.action for v in parsed.verdicts] == [f["verdict"] for f in frames]


@given(verdicts, st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0.5", "1.0000001", "true"]))
def test_a_confidence_outside_zero_to_one_is_review(verdict: dict[str, Any], confidence: str) -> None:
    text = json.dumps({**verdict, "confidence": 0.5}).replace("0.5", confidence)
    (parsed,) = parse_engine_output(text, None, "stop").verdicts
    assert (parsed.action, parsed.problem) == ("review", "schema_mismatch")


@given(st.integers(min_value=1, max_value=20_000), st.sampled_from("[{"))
def test_output_nested_arbitrarily_deep_is_review_not_a_crash(depth: int, opener: str) -> None:
    step, closer = ("[", "]") if opener == "[" else ('{"k":', "}")
    text = step * depth + "1" + closer * depth
    (parsed,) = parse_engine_output(text, None, "stop").verdicts
    assert parsed.action == "review"


@given(verdicts, st.integers(min_value=0, max_value=100))
def test_compact_verdicts_match_the_regex_and_parse_cleanly(verdict: dict[str, Any], hundredths: int) -> None:
    ordered = {"verdict": verdict["verdict"], "categories": verdict["categories"]}
    ordered["confidence"] = hundredths / 100
    compact = json.dumps(ordered, separators=(",", ":"))  # the field order the engine is held to
    assert re.fullmatch(verdict_regex(), compact)
    assert parse_engine_output(compact, None, "stop").verdicts[0].problem is None
