"""The confidence from llama.cpp-shaped logprobs: a softmax over the raw logits, not grammar-masked.

llama-server lists ``{id, token, bytes, logprob, top_logprobs}`` per token (tools/server/server-task.cpp,
``probs_vector_to_json``); the probabilities are taken before the grammar (``get_token_probabilities``,
server-common.cpp), so the listed alternatives hold tokens the grammar forbids, and a probability that is
0 in float reads ``logprob`` -FLT_MAX (``completion_token_output::logarithm``). The answer is cut into
Qwen's real BPE (shaping.bpe).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from gateway.engine.wires import wire_for
from gateway.engine.wires.llamacpp import LLAMACPP_ALTERNATIVES_PER_MASKED
from shaping.bpe import FAMILIES, Family, qwen_bpe
from shaping.confidence import TokenLogprob, place_read, with_confidence
from shaping.verdict import compact_regex, parse_engine_output

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


def test_llamacpp_is_asked_for_more_alternatives_than_vllm() -> None:
    body = {"messages": [], "logprobs": True, "top_logprobs": 10}
    assert wire_for("vllm").chat_body(body)["top_logprobs"] == 10
    assert wire_for("llamacpp").chat_body(body)["top_logprobs"] == 10 * LLAMACPP_ALTERNATIVES_PER_MASKED
    assert "top_logprobs" not in wire_for("llamacpp").chat_body({"messages": []})  # none asked, none added


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_llamacpp_logprobs_are_renormalised_over_what_can_begin_a_verdict(vocabulary: Family) -> None:
    verdict = read("allow", answer_logprobs("allow", vocabulary, 10, RAW), grammar_masked=False)
    assert verdict.confidence == pytest.approx(0.2 / 0.4)  # allow's 0.2 of the 0.4 the grammar allows
    # read as vLLM's (already masked), the same numbers would give the raw 0.2: the flag is what differs
    assert read("allow", answer_logprobs("allow", vocabulary, 10, RAW), grammar_masked=True).confidence == (
        pytest.approx(0.2)
    )


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_a_spelling_with_other_leading_whitespace_is_not_credited(vocabulary: Family) -> None:
    logprobs = answer_logprobs("block:violence", vocabulary, 10, RAW)
    verdict = read("block:violence", logprobs, grammar_masked=False)
    assert verdict.action == "block"
    # `` block`` (0.05) is another head than the chosen ``block``'s: the grammar may forbid the space there,
    # so it is not credited, but it stays in what may be admitted (a lower bound either way)
    assert verdict.confidence == pytest.approx(0.1 / 0.4)
    scores = dict(verdict.category_scores)
    # the path inside the name is not read on raw probabilities: the named category scores P(block)
    assert scores["violence"] == pytest.approx(verdict.confidence, abs=1e-4)


def test_a_forbidden_token_listed_first_is_left_out_and_what_is_not_listed_counts_as_allowed() -> None:
    # top_logprobs 1: the forbidden best token and the chosen one are listed; the 0.55 left out may be
    # allowed spellings, so it is counted as another action's: 0.05 / (0.05 + 0.55), not 0.05 / 0.05 = 1.0
    verdict = read("review", answer_logprobs("review", "qwen2.5", 1, RAW), grammar_masked=False)
    assert verdict.confidence == pytest.approx(0.05 / 0.6, abs=1e-4)
    assert verdict.confidence < 0.05 / 0.4  # below review's true share of what the grammar allows


@pytest.mark.parametrize("vocabulary", FAMILIES)
@pytest.mark.parametrize("answer", ["allow", "block:violence", "review"])
def test_a_shorter_raw_list_never_raises_the_confidence(vocabulary: Family, answer: str) -> None:
    # the true reading, every alternative listed: the action's share of the 0.4 the grammar allows
    # (`` block`` counted as admitted but credited to no action: the grammar may forbid the space)
    truth = {"allow": 0.2 / 0.4, "block:violence": 0.1 / 0.4, "review": 0.05 / 0.4}[answer]
    readings = [
        read(answer, answer_logprobs(answer, vocabulary, k, RAW), grammar_masked=False).confidence
        for k in (10, 6, 5, 4, 3, 2, 1)
    ]
    assert readings[0] == pytest.approx(truth, abs=1e-4)
    assert None not in readings
    for longer, shorter in itertools.pairwise(readings):
        assert shorter <= longer + 1e-4, readings


def test_a_categorys_path_counts_what_the_list_left_out_as_allowed() -> None:
    # at the category's place (``viol``): a forbidden blank, violence, self-harm, a forbidden "The" and
    # hate; each token on the path is its share of 1 minus the listed tokens the grammar surely forbids
    place = {"\n": 0.4, "viol": 0.3, "self": 0.2, "The": 0.05, "hate": 0.05}
    pieces = [*qwen_bpe("qwen2.5").pieces("block:violence"), "<|im_end|>"]
    assert pieces[2] == "viol"

    def scores(k: int) -> dict[str, float]:
        entries = [
            TokenLogprob.from_wire(llamacpp_entry(piece, place if piece == "viol" else {piece: 1.0}, k))
            for piece in pieces
        ]
        return dict(read("block:violence", entries, grammar_masked=False).category_scores)

    assert scores(5)["violence"] == pytest.approx(0.3 / 0.55, abs=1e-4)  # all listed: 0.3 of the allowed 0.55
    assert scores(5)["hate"] == pytest.approx(0.05 / 0.55, abs=1e-4)  # "hate" spells its whole path
    # three listed: "The" (0.05) left out and counted as allowed: 0.3 / 0.6, not 0.3 / 0.55 above it
    assert scores(3)["violence"] == pytest.approx(0.3 / 0.6, abs=1e-4)
    assert "hate" not in scores(3)  # not listed: unknown


def test_every_allowed_token_at_zero_in_float_gives_no_confidence_and_says_why() -> None:
    # what the tiny model's llama-server does: one forbidden token holds all the float mass
    degenerate = {" " * 128: 1.0, "//---": 0.0, "review": 0.0, "allow": 0.0}
    verdict = read("review", answer_logprobs("review", "qwen2.5", 5, degenerate), grammar_masked=False)
    assert verdict.confidence is None
    assert "raw softmax" in (verdict.confidence_note or "")


# the raw softmax at the verdict's first token with the twins a model ranks beside the allowed spellings:
# the grammar admits only `allow` (0.5) and `block` (0.15) here; the twins are forbidden at that place
TWINS = {"allow": 0.5, " allow": 0.1, "allowed": 0.1, "Allow": 0.1, "block": 0.15, "blocked": 0.05}


@pytest.mark.parametrize("vocabulary", FAMILIES)
@pytest.mark.parametrize("k", [6, 5, 4, 3, 2, 1])
def test_twins_the_grammar_forbids_never_raise_the_confidence_above_the_truth(
    vocabulary: Family, k: int
) -> None:
    truth = 0.5 / (0.5 + 0.15)  # 0.769, allow's share of what the grammar admits at the verdict's first place
    verdict = read("allow", answer_logprobs("allow", vocabulary, k, TWINS), grammar_masked=False)
    assert verdict.confidence is not None
    assert verdict.confidence <= truth + 1e-4
    if k == 6:  # every alternative listed: the leading-space twin may or may not be admitted, so it is
        # mass the reading cannot credit; the capitalised and longer twins are forbidden and left out
        assert verdict.confidence == pytest.approx(0.5 / (0.5 + 0.15 + 0.1), abs=1e-4)


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_a_block_is_not_credited_with_blocked(vocabulary: Family) -> None:
    raw = {"block": 0.3, "blocked": 0.3, "allow": 0.2, "Block": 0.2}
    logprobs = answer_logprobs("block:violence", vocabulary, 4, raw)
    verdict = read("block:violence", logprobs, grammar_masked=False)
    assert verdict.confidence == pytest.approx(0.3 / 0.5, abs=1e-4)


def compact_body(frames: int, *, thinking: bool = False) -> dict[str, Any]:
    """The gateway's compact request in vLLM's shape (what the wire turns into llama.cpp's)."""
    return {
        "model": "tiny", "messages": [{"role": "user", "content": "frames"}], "temperature": 0,
        "max_completion_tokens": 16 * frames, "chat_template_kwargs": {"enable_thinking": thinking},
        "structured_outputs": {"regex": compact_regex(frames)}, "logprobs": True, "top_logprobs": 5,
        "stream": True, "stream_options": {"include_usage": True},
    }


def test_a_place_probe_asks_llamacpp_for_one_token_read_after_its_sampler_chain() -> None:
    probe = wire_for("llamacpp").place_probe(compact_body(3), "allow\n", compact_regex(2))
    assert probe is not None
    # the model's own probabilities, nothing truncated, read after the chain (the grammar's where it drew
    # again under it); one token, not streamed; the draw is thrown away, the verdict stays the greedy one
    assert {k: probe[k] for k in ("temperature", "top_k", "top_p", "min_p", "post_sampling_probs")} == {
        "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "post_sampling_probs": True}
    assert probe["max_completion_tokens"] == 1
    assert "stream" not in probe
    assert "stream_options" not in probe
    assert probe["top_logprobs"] == 5 * LLAMACPP_ALTERNATIVES_PER_MASKED
    # the earlier frame's line is the assistant's start; the grammar holds what is left: two lines
    assert probe["messages"][-1] == {"role": "assistant", "content": "allow\n"}
    assert probe["grammar"] == wire_for("llamacpp").chat_body(compact_body(2))["grammar"]


def test_no_place_probe_where_the_answer_already_is_the_grammars_or_thinking_runs_first() -> None:
    assert wire_for("vllm").place_probe(compact_body(1), "", compact_regex(1)) is None
    assert wire_for("llamacpp").place_probe(compact_body(1, thinking=True), "", compact_regex(1)) is None


def test_a_probed_place_gives_the_confidence_the_raw_softmax_could_not() -> None:
    # the tiny model's raw list (every allowed spelling 0 in float), and what a probe read at the same place
    degenerate = {" " * 128: 1.0, "review": 0.0, "allow": 0.0, "block": 0.0}
    logprobs = answer_logprobs("review", "qwen2.5", 4, degenerate)
    parsed = parse_engine_output("review", None, "stop")
    place = (("review", 0.99995), ("allow", 2.6e-5), ("block", 2.4e-5), ("rev", 1e-14))
    (raw,) = with_confidence(parsed.verdicts, logprobs, "review", grammar_masked=False)
    (probed,) = with_confidence(parsed.verdicts, logprobs, "review", grammar_masked=False, places={0: place})
    assert raw.confidence is None
    assert probed.confidence == pytest.approx(0.99995, abs=1e-4)
    assert probed.confidence_note is None
    # a probe whose draw passed the grammar lists the raw softmax: read as raw, a lower bound
    raw_place = (("review", 0.5), ("\n", 0.3), ("Review", 0.1), ("allow", 0.1))
    (bound,) = with_confidence(
        parsed.verdicts, logprobs, "review", grammar_masked=False, places={0: raw_place}
    )
    assert bound.confidence == pytest.approx(0.5 / 0.6, abs=1e-4)


def test_a_probe_whose_draw_the_grammar_allowed_reads_nothing_and_is_drawn_again() -> None:
    # After llama.cpp's chain: a redraw under the grammar lists the allowed actions (read); a first draw the
    # grammar allowed leaves the raw softmax, which for the tiny model lists none of them (drawn again)
    assert place_read((("review", 0.99996), ("allow", 2.1e-5), ("block", 2.0e-5)))
    assert not place_read(((" the", 0.4), ("\n", 0.3), ("Allow", 0.2)))
    assert not place_read(())
    assert not place_read(None)
