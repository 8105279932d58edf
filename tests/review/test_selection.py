"""Which verdicts go to people: review always, unsure under the threshold, an audit sample of the rest."""

from __future__ import annotations

import random

from gateway.review.selection import review_reason


class Fixed:
    """A "random" source that answers one number."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_a_review_verdict_always_goes_to_people() -> None:
    assert review_reason("review", 0.99, 0.0, 0.0, Fixed(0.99)) == "review"


def test_a_verdict_under_the_threshold_goes_as_unsure() -> None:
    assert review_reason("block", 0.55, 0.7, 0.0, Fixed(0.99)) == "unsure"
    assert review_reason("allow", None, 0.7, 0.0, Fixed(0.99)) == "unsure"  # no confidence: unsure


def test_a_confident_verdict_goes_only_when_sampled() -> None:
    assert review_reason("allow", 0.95, 0.7, 0.1, Fixed(0.05)) == "audit"
    assert review_reason("allow", 0.95, 0.7, 0.1, Fixed(0.15)) is None


def test_no_threshold_and_no_sample_sends_nothing_but_reviews() -> None:
    assert review_reason("block", None, 0.0, 0.0, Fixed(0.0)) is None


def test_the_audit_sample_comes_near_its_rate() -> None:
    rng = random.Random(7)
    sampled = sum(review_reason("allow", 0.99, 0.5, 0.2, rng) == "audit" for _ in range(10_000))
    assert 1800 < sampled < 2200
