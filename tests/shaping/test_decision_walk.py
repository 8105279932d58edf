"""A decision question's distribution walked place by place (shaping/decisions.py): answers whose first
tokens collide are told apart, tokens the grammar forbids are dropped, and a list that leaves too much out
reads no distribution (never a made-up 1.0)."""

from __future__ import annotations

import pytest

from shaping.decisions import DistributionWalk, answers_regex, option_labels, place_shares


def walk_through(labels: list[str], places: dict[str, list[tuple[str, float]]]) -> DistributionWalk:
    walk = DistributionWalk(labels, max_places=10)
    while (before := walk.next_place()) is not None:
        walk.record(before, places[before])
    return walk


def test_answers_sharing_a_first_token_are_told_apart_at_the_next_place() -> None:
    walk = walk_through(
        ["violence", "violent", "none"],
        {"": [("viol", 0.8), ("none", 0.2)], "viol": [("ence", 0.25), ("ent", 0.75)]},
    )
    assert walk.result().probabilities == pytest.approx((0.2, 0.6, 0.2))


def test_an_answer_that_is_the_start_of_another_is_read_from_the_end_of_output() -> None:
    walk = walk_through(
        ["viol", "violence"], {"": [("viol", 1.0)], "viol": [("<|im_end|>", 0.3), ("ence", 0.7)]}
    )
    assert walk.result().probabilities == pytest.approx((0.3, 0.7))


def test_tokens_the_grammar_forbids_are_dropped_and_the_rest_normalised() -> None:
    shares = place_shares([("yes", 0.6), ("Yes", 0.3), ("no", 0.1)], "", ["yes", "no"])
    assert shares.settled == pytest.approx({"yes": 0.6 / 0.7, "no": 0.1 / 0.7})


def test_a_list_that_leaves_mass_out_reads_no_distribution() -> None:
    walk = walk_through(["yes", "no"], {"": [("yes", 0.5), ("no", 0.3)]})
    result = walk.result()
    assert result.probabilities is None
    assert "leaves" in (result.note or "")


def test_no_list_reads_no_distribution() -> None:
    walk = DistributionWalk(["yes", "no"], max_places=4)
    walk.record("", None)
    assert walk.result().probabilities is None


def test_an_inexact_draw_that_is_not_final_is_not_taken() -> None:
    walk = DistributionWalk(["yes", "no"], max_places=4)
    assert walk.record("", [("yes", 0.5)], final=False) is False
    assert walk.next_place() == ""
    assert walk.record("", [("yes", 0.5), ("no", 0.5)], final=False) is True
    assert walk.result().probabilities == pytest.approx((0.5, 0.5))


def test_a_boolean_option_spelled_like_a_string_option_is_named_apart() -> None:
    assert option_labels(["true", True, False]) == ("true", "boolean true", "false")


def test_the_grammar_after_an_answer_so_far_admits_the_rests_and_the_end() -> None:
    assert answers_regex(["viol", "violence", "none"], "viol") == "(?:ence)?"


def test_only_regex_metacharacters_are_escaped_in_an_answer() -> None:
    assert answers_regex(["a b-c", "x.y"]) == r"(?:x\.y|a b-c)"
