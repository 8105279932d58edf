"""Confidence from the engine's logprobs: the chosen action's own probability, never renormalised."""

from __future__ import annotations

import math
from typing import Any

import pytest

from shaping.confidence import TokenLogprob, with_confidence
from shaping.verdict import parse_engine_output


def entry(token: str, alternatives: dict[str, float] | None = None) -> dict[str, Any]:
    """One token in vLLM's ``logprobs.content`` shape; alternatives as probabilities (masked: -9999.0)."""
    alternatives = alternatives or {token: 1.0}
    top = [
        {"token": t, "logprob": math.log(p) if p > 0 else -9999.0, "bytes": list(t.encode())}
        for t, p in alternatives.items()
    ]
    chosen = alternatives.get(token, 1.0)
    return {"token": token, "logprob": math.log(chosen), "bytes": list(token.encode()), "top_logprobs": top}


def read(content: str, entries: list[dict[str, Any]], frames: int = 1) -> list[Any]:
    parsed = parse_engine_output(content, None, "stop", frames=frames)
    return list(with_confidence(parsed.verdicts, [TokenLogprob.from_wire(e) for e in entries], content))


def test_the_confidence_is_the_chosen_actions_share_of_the_three() -> None:
    (verdict,) = read("allow", [entry("allow", {"allow": 0.6, "review": 0.3, "block": 0.1}), entry("")])
    assert verdict.confidence == pytest.approx(0.6)
    assert verdict.confidence_note is None


def test_other_spellings_of_the_action_add_and_nothing_else_counts() -> None:
    alternatives = {"review": 0.3, "allow": 0.1, "{": 0.0, "rev": 0.1, "hello": 0.2}
    (verdict,) = read("review", [entry("review", alternatives), entry("<|im_end|>")])
    # review = "review" + "rev" (a shorter spelling of the same start); "hello" and masked "{" add nothing,
    # and the 0.3 the list does not hold is not shared out: the confidence is 0.4, not 0.4 / 0.5
    assert verdict.confidence == pytest.approx(0.4)


def test_a_verdict_split_into_short_tokens_is_read_at_its_first_token() -> None:
    entries = [
        entry("bl", {"bl": 0.5, "al": 0.25, "r": 0.25}),
        entry("ock"),
        entry(":"),
        entry("hate", {"hate": 0.9, "harassment": 0.05, "harassme": 0.05}),
        entry("<|im_end|>"),
    ]
    (verdict,) = read("block:hate", entries)
    assert verdict.confidence == pytest.approx(0.5)
    scores = dict(verdict.category_scores or ())
    assert scores["hate"] == pytest.approx(0.5 * 0.9)
    # "harassment" spells that whole path (no longer category begins with it): its own probability
    assert scores["harassment"] == pytest.approx(0.5 * 0.05)
    assert "sexual" not in scores  # no listed token reaches its end: unknown, not 0


def test_a_category_that_could_go_on_to_a_longer_one_is_weighed_where_it_ends() -> None:
    entries = [
        entry("block", {"block": 0.8, "allow": 0.2}),
        entry(":"),
        entry("sexual", {"sexual": 0.6, "self": 0.4}),
        entry("", {"": 0.75, "/": 0.25}),  # the stop token, or "/" towards sexual/minors
    ]
    (verdict,) = read("block:sexual", entries)
    scores = dict(verdict.category_scores or ())
    assert scores["sexual"] == pytest.approx(0.8 * 0.6 * 0.75)
    # "self" and "/" only begin self-harm and sexual/minors: their paths are unknown, not 0 nor 0.8 * 0.4
    assert "self-harm" not in scores
    assert "sexual/minors" not in scores


def test_with_thinking_the_verdict_is_found_after_the_reasoning() -> None:
    entries = [entry("画面"), entry("allow"), entry("。"), entry("</think>")]
    entries += [entry("review", {"review": 0.7, "block": 0.3}), entry("<|im_end|>")]
    (verdict,) = read("review", entries)
    assert verdict.confidence == pytest.approx(0.7)


def test_a_streamed_answer_without_the_closing_tag_is_found_from_the_end() -> None:
    entries = [entry("allow"), entry("，"), entry("block", {"block": 0.9, "allow": 0.1}), entry("")]
    (verdict,) = read("block:hate", [*entries[:3], entry(":"), entry("hate"), entries[3]])
    assert verdict.confidence == pytest.approx(0.9)


def test_the_json_form_is_read_at_the_actions_token() -> None:
    content = '{"verdict":"block","categories":["violence"],"confidence":0.9}'
    pieces = ['{"', "verdict", '":"']
    entries = [entry(p) for p in pieces]
    entries.append(entry("block", {"block": 0.25, "allow": 0.75}))
    entries += [entry('","'), entry("categories"), entry('":["')]
    entries.append(entry("violence", {"violence": 0.5, "hate": 0.5}))
    entries += [entry('"],"', {'"],"': 1.0}), entry("confidence"), entry('":'), entry("0.9"), entry("}")]
    (verdict,) = read(content, entries)
    assert verdict.confidence == pytest.approx(0.25)  # the model wrote 0.9: that is not the confidence
    assert verdict.stated_confidence == 0.9
    assert dict(verdict.category_scores or ())["violence"] == pytest.approx(0.25 * 0.5)


def test_packed_compact_verdicts_each_get_their_own_confidence() -> None:
    entries = [
        entry("allow", {"allow": 0.9, "block": 0.1}),
        entry("\n"),
        entry("review", {"review": 0.55, "allow": 0.45}),
        entry(""),
    ]
    verdicts = read("allow\nreview", entries, frames=2)
    assert [v.confidence for v in verdicts] == [pytest.approx(0.9), pytest.approx(0.55)]


def test_no_logprobs_means_no_confidence_and_a_reason() -> None:
    parsed = parse_engine_output("allow", None, "stop")
    (verdict,) = with_confidence(parsed.verdicts, None, "allow", missing="the engine returned no logprobs")
    assert verdict.confidence is None
    assert verdict.confidence_note == "the engine returned no logprobs"


def test_logprobs_that_do_not_spell_the_answer_give_no_confidence() -> None:
    (verdict,) = read("allow", [entry("review"), entry("")])
    assert verdict.confidence is None
    assert verdict.confidence_note is not None
    assert "do not spell" in verdict.confidence_note


def test_an_unparsable_answer_has_no_confidence() -> None:
    parsed = parse_engine_output("bl", None, "length")
    (verdict,) = with_confidence(parsed.verdicts, [TokenLogprob.from_wire(entry("bl"))], "bl")
    assert (verdict.action, verdict.confidence) == ("review", None)
    assert verdict.confidence_note == "the verdict could not be parsed"


def test_a_malformed_logprob_entry_reads_as_impossible_not_as_a_crash() -> None:
    token = TokenLogprob.from_wire({"token": "allow", "logprob": None, "top_logprobs": [{"token": 3}, "x"]})
    assert token.logprob == float("-inf")
    (verdict,) = with_confidence(parse_engine_output("allow", None, "stop").verdicts, [token], "allow")
    assert verdict.confidence is None
