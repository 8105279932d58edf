"""The confidence from llama.cpp-shaped logprobs: a softmax over the raw logits, not grammar-masked.

llama-server lists ``{id, token, bytes, logprob, top_logprobs}`` per token (tools/server/server-task.cpp,
``probs_vector_to_json``); the probabilities are taken before the grammar (``get_token_probabilities``,
server-common.cpp), so the listed alternatives hold tokens the grammar forbids, and a probability that is
0 in float reads ``logprob`` -FLT_MAX (``completion_token_output::logarithm``). The answer is cut into
Qwen's real BPE (shaping.bpe).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.engine.kinds import wire_for
from shaping.bpe import FAMILIES, Family, qwen_bpe
from shaping.confidence import TokenLogprob, with_confidence
from shaping.verdict import parse_engine_output

FLT_LOWEST = -3.4028234663852886e38  # llama.cpp's logprob for a probability of 0 (std::numeric_limits)


def llamacpp_entry(token: str, distribution: dict[str, float], k: int) -> dict[str, Any]:
    """One entry of llama-server's ``logprobs.content``: ``id`` first, then the ``k`` best of the raw
    softmax ``distribution`` (tokens the grammar forbids included)."""
    def logprob(p: float) -> float:
        return math.log(p) if p > 0 else FLT_LOWEST

    best = sorted(distribution.items(), key=lambda pair: -pair[1])[:k]
    return {
        "id": abs(hash(token)) % 151_000,
        "token": token,
        "bytes": list(token.encode()),
        "logprob": logprob(distribution.get(token, 0.0)),
        "top_logprobs": [
            {"id": n, "token": t, "bytes": list(t.encode()), "logprob": logprob(p)}
            for n, (t, p) in enumerate(best)
        ],
    }


def answer_logprobs(answer: str, vocabulary: Family, k: int, first: dict[str, float]) -> list[TokenLogprob]:
    """``answer`` in Qwen's real BPE tokens and the stop token; the first drawn from ``first``."""
    tokens = [*qwen_bpe(vocabulary).pieces(answer), "<|im_end|>"]
    return [
        TokenLogprob.from_wire(llamacpp_entry(t, first if i == 0 else {t: 1.0}, k))
        for i, t in enumerate(tokens)
    ]


def read(answer: str, logprobs: list[TokenLogprob], *, grammar_masked: bool) -> Any:
    (verdict,) = with_confidence(
        parse_engine_output(answer, None, "stop").verdicts, logprobs, answer, grammar_masked=grammar_masked
    )
    return verdict


# the raw softmax at the verdict's first token: most of the mass on tokens the grammar forbids
RAW = {"\n": 0.4, "The": 0.2, "allow": 0.2, "block": 0.1, " block": 0.05, "review": 0.05}


def test_the_protocol_says_whose_logprobs_are_grammar_masked() -> None:
    assert wire_for("vllm").logprobs_grammar_masked is True
    assert wire_for("llamacpp").logprobs_grammar_masked is False


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_llamacpp_logprobs_are_renormalised_over_what_can_begin_a_verdict(vocabulary: Family) -> None:
    verdict = read("allow", answer_logprobs("allow", vocabulary, 10, RAW), grammar_masked=False)
    assert verdict.confidence == pytest.approx(0.2 / 0.4)  # allow's 0.2 of the 0.4 the grammar allows
    # read as vLLM's (already masked), the same numbers would give the raw 0.2: the flag is what differs
    assert read("allow", answer_logprobs("allow", vocabulary, 10, RAW), grammar_masked=True).confidence == (
        pytest.approx(0.2)
    )


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_other_spellings_of_the_action_still_add_after_renormalising(vocabulary: Family) -> None:
    logprobs = answer_logprobs("block:violence", vocabulary, 10, RAW)
    verdict = read("block:violence", logprobs, grammar_masked=False)
    assert verdict.action == "block"
    assert verdict.confidence == pytest.approx((0.1 + 0.05) / 0.4)
    scores = dict(verdict.category_scores)
    # the path inside the name is not read on raw probabilities: the named category scores P(block)
    assert scores["violence"] == pytest.approx(verdict.confidence, abs=1e-4)


def test_a_forbidden_token_listed_first_is_left_out_not_counted() -> None:
    # top_logprobs 1: only the forbidden best token and the chosen one are known; the chosen is all allowed
    verdict = read("review", answer_logprobs("review", "qwen2.5", 1, RAW), grammar_masked=False)
    assert verdict.confidence == pytest.approx(1.0)


def test_every_allowed_token_at_zero_in_float_gives_no_confidence_and_says_why() -> None:
    # what the tiny model's llama-server does: one forbidden token holds all the float mass
    degenerate = {" " * 128: 1.0, "//---": 0.0, "review": 0.0, "allow": 0.0}
    verdict = read("review", answer_logprobs("review", "qwen2.5", 5, degenerate), grammar_masked=False)
    assert verdict.confidence is None
    assert "raw softmax" in (verdict.confidence_note or "")
