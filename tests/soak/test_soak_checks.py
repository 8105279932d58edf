"""The soak's checks (bench/soak_checks.py) over planted records: each says no to the defect it is for."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.soak_checks import (
    Answer,
    Observations,
    Window,
    engine_caps,
    engine_outcomes,
    job_decision_rows,
    result_decisions,
    review_items,
    reviewer_kappa,
)
from bench.soak_checks import check as all_checks

STAMP = "2026-12-06T03:00:00Z"


def decision(decision_id: str, **fields: Any) -> dict[str, Any]:
    """A decision-log row as the stream holds it."""
    return {"decided_at": STAMP, "request_id": "modr-1", "tenant": "tenant-a", "frame_sha256": "ab",
            "kind": "judged", "automated": True, "action": "allow", "categories": [], "confidence": 0.9,
            "model": "m", "prompt_version": "v1", "moderation_policy_version": 1, "thinking": "off",
            "decision_id": decision_id, **fields}


def label(decision_id: str, reviewer: str, action: str = "allow") -> dict[str, Any]:
    """A person's label of ``decision_id``."""
    return decision(decision_id, kind="label", automated=False, action=action, confidence=None, model=None,
                    prompt_version=None, moderation_policy_version=None, thinking=None,
                    labelled_by=reviewer, review_reason="audit")


def test_a_replica_that_ignores_the_cap_breaks_it_even_inside_a_redis_fault() -> None:
    # two replicas on their full caps during a primary's kill: 8 at an engine of 4
    seen = Observations(caps={"engine-vllm": 4}, windows=[Window("redis_primary_kill", 50.0, 60.0)],
                        engine_peaks=[(40.0, "engine-vllm", 4), (55.0, "engine-vllm", 8)])

    (cap,) = engine_caps(seen)
    assert (cap["count"], cap["broken"], cap["holds"]) == (2, 1, False)
    assert "over at [55] s" in cap["detail"]


def test_an_engine_within_its_cap_holds() -> None:
    seen = Observations(caps={"engine-vllm": 4}, engine_peaks=[(40.0, "engine-vllm", 4)])

    assert engine_caps(seen)[0]["holds"]


def test_a_doubled_decision_row_of_a_job_frame_breaks_the_job_rows_check() -> None:
    seen = Observations(job_decisions={"job-1": ["d1", "d2"]},
                        decision_rows=[decision("d1"), decision("d2"), decision("d2")])

    check = job_decision_rows(seen)
    assert (check["count"], check["broken"]) == (2, 1)
    assert "1 doubled" in check["detail"]


def test_a_job_frame_with_no_row_breaks_the_job_rows_check_and_one_row_each_holds() -> None:
    lost = Observations(job_decisions={"job-1": ["d1", "d2"]}, decision_rows=[decision("d1")])
    whole = Observations(job_decisions={"job-1": ["d1", "d2"]},
                         decision_rows=[decision("d1"), decision("d2"), decision("d0")])  # d0: an earlier try

    assert (job_decision_rows(lost)["broken"], job_decision_rows(whole)["holds"]) == (1, True)


def test_a_job_results_decisions_are_read_from_its_document() -> None:
    result = '{"frames": [{"modgate": {"decision_id": "d1"}}, {"modgate": {"decision_id": "d2"}}]}'

    assert result_decisions(result) == ["d1", "d2"]


def test_a_review_item_dropped_before_anyone_claimed_it_breaks_the_review_check() -> None:
    # queued (its decision's row says why), never claimed, never labelled, not in the queue at the end
    seen = Observations(decision_rows=[decision("d1", review_reason="review"),
                                       decision("d2", review_reason="review"), label("d2", "rita")])

    check = review_items(seen)
    assert (check["count"], check["broken"]) == (2, 1)


def test_review_items_labelled_or_still_queued_hold() -> None:
    seen = Observations(decision_rows=[decision("d1", review_reason="audit"),
                                       decision("d2", review_reason="review"), label("d2", "rita")],
                        still_queued_decisions={"d1"})

    assert review_items(seen)["holds"]


def test_kappa_needs_two_reviewers_of_the_same_decision() -> None:
    one = Observations(decision_rows=[decision("d1", review_reason="audit"), label("d1", "rita"),
                                      label("d1", "rita")])
    two = Observations(decision_rows=[decision("d1", review_reason="audit"), label("d1", "rita"),
                                      label("d1", "sam"), decision("d2", review_reason="audit"),
                                      label("d2", "rita", "block"), label("d2", "sam", "allow")])

    assert (reviewer_kappa(one)["count"], reviewer_kappa(one)["holds"]) == (0, False)
    pairs = reviewer_kappa(two)
    assert (pairs["count"], pairs["holds"]) == (2, True)
    assert "on 2 pairs" in pairs["detail"]


def test_a_call_counted_ok_that_the_engine_never_answered_whole_breaks_the_outcome_check() -> None:
    # a verdict that timed out after its headers, recorded as ok: 11 ok for 10 whole answers
    mislabelled = Observations(engine_ok={"engine-vllm": Counter({"verdict": 9, "probe": 2, "tokenize": 4})},
                               engine_whole={"engine-vllm": 10})
    true = Observations(engine_ok={"engine-vllm": Counter({"verdict": 8, "probe": 2})},
                        engine_whole={"engine-vllm": 12})  # two whole answers in flight at a replica's kill

    (wrong,) = engine_outcomes(mislabelled)
    assert (wrong["count"], wrong["broken"]) == (11, 1)
    assert engine_outcomes(true)[0]["holds"]


def live(tenant: str, began: float, granted: float) -> Answer:
    """A live call of ``tenant`` whose verdict waited for a slot from ``began`` to ``granted``."""
    return Answer(began, "live", tenant, 200, granted - began + 0.3, actions=("allow",),
                  waits=((began, granted),))


def fair_share_row(answers: list[Answer], windows: list[Window] | None = None) -> dict[str, Any]:
    (row,) = [r for r in all_checks(Observations(answers=answers, windows=windows or []))
              if r["invariant"].startswith("fair shares")]
    return row


def test_slots_both_tenants_waited_for_going_two_to_one_break_the_fair_share() -> None:
    # first come, first served: both always have a call waiting, and tenant-a, with twice the callers,
    # takes two of every three slots
    answers = []
    for i in range(1, 61):
        at = i * 1.0
        answers += [live("tenant-a", at - 0.5, at + 0.2), live("tenant-a", at - 0.3, at + 0.4),
                    live("tenant-b", at - 0.2, at + 0.6)]
    row = fair_share_row(answers)

    assert not row["holds"]
    assert "{'tenant-a': 120, 'tenant-b': 59}" in row["detail"]  # the last b: no a waits after it


def test_a_tenant_that_often_waits_for_nothing_gets_less_overall_yet_its_fair_share_holds() -> None:
    # both waiting: the slots alternate; then tenant-a alone, for as long again, takes every slot
    answers = []
    for i in range(40):
        at = i * 2.0
        answers += [live("tenant-a", at, at + 0.3), live("tenant-b", at, at + 0.6),
                    live("tenant-a", at + 0.1, at + 0.9)]  # contested alike, as tenant-b's wait spans it
        answers += [live("tenant-a", at + 1.2, at + 1.3), live("tenant-a", at + 1.4, at + 1.5)]
    row = fair_share_row(answers)

    assert row["holds"], row
    assert "{'tenant-a': 0.8, 'tenant-b': 0.2}" in row["detail"]  # overall: not the measure


def test_no_slot_both_tenants_waited_for_is_nothing_to_judge_and_says_no() -> None:
    answers = [live("tenant-a", i, i + 0.2) for i in range(20)] + [
        live("tenant-b", i + 0.5, i + 0.7) for i in range(20)]

    assert not fair_share_row(answers)["holds"]


def test_contested_slots_inside_a_fault_window_are_not_counted() -> None:
    answers = []
    for i in range(60):
        at = i * 1.0
        answers += [live("tenant-a", at, at + 0.4), live("tenant-a", at + 0.1, at + 0.6),
                    live("tenant-b", at + 0.05, at + 0.8)]
    row = fair_share_row(answers, [Window("redis_primary_kill", -1.0, 70.0)])

    assert row["count"] == 0
