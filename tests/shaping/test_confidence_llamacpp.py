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

from gateway.engine.wires import wire_for
from gateway.engine.wires.llamacpp import LLAMACPP_ALTERNATIVES_PER_MASKED
from shaping.bpe import FAMILIES, Family, qwen_bpe
from shaping.confidence import (
    NO_GRAMMAR,
    NOTHING_ADMITTED,
    UNLISTED_MASS,
    TokenLogprob,
    grammar_admits,
    place_exact,
    with_confidence,
)
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
    frames = len(answer.splitlines())
    (verdict,) = with_confidence(
        parse_engine_output(answer, None, "stop", frames=frames).verdicts, logprobs, answer,
        grammar_masked=grammar_masked, grammar=compact_regex(frames),
    )
    return verdict


def note_code(verdict: Any) -> str:
    return str(verdict.confidence_note or "").partition(":")[0]


# the raw softmax at the verdict's first token: most of the mass on tokens the grammar forbids
RAW = {"\n": 0.4, "The": 0.2, "allow": 0.2, "block": 0.1, " block": 0.05, "review": 0.05}
ADMITTED = 0.2 + 0.1 + 0.05  # allow, block, review: no blank before a verdict in the compact grammar


def test_the_protocol_says_whose_logprobs_are_grammar_masked() -> None:
    assert wire_for("vllm").logprobs_grammar_masked is True
    assert wire_for("llamacpp").logprobs_grammar_masked is False


def test_llamacpp_is_asked_for_more_alternatives_than_vllm() -> None:
    body = {"messages": [], "logprobs": True, "top_logprobs": 10}
    assert wire_for("vllm").chat_body(body)["top_logprobs"] == 10
    assert wire_for("llamacpp").chat_body(body)["top_logprobs"] == 10 * LLAMACPP_ALTERNATIVES_PER_MASKED
    assert "top_logprobs" not in wire_for("llamacpp").chat_body({"messages": []})  # none asked, none added


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_llamacpp_logprobs_are_renormalised_over_what_the_grammar_admits(vocabulary: Family) -> None:
    verdict = read("allow", answer_logprobs("allow", vocabulary, 10, RAW), grammar_masked=False)
    assert verdict.confidence == pytest.approx(0.2 / ADMITTED, abs=1e-4)
    assert verdict.confidence_note is None
    # read as vLLM's (already masked), the same numbers would give the raw 0.2: the flag is what differs
    assert read("allow", answer_logprobs("allow", vocabulary, 10, RAW), grammar_masked=True).confidence == (
        pytest.approx(0.2)
    )


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_a_spelling_with_a_blank_the_grammar_forbids_is_left_out(vocabulary: Family) -> None:
    logprobs = answer_logprobs("block:violence", vocabulary, 10, RAW)
    verdict = read("block:violence", logprobs, grammar_masked=False)
    assert verdict.action == "block"
    assert verdict.confidence == pytest.approx(0.1 / ADMITTED, abs=1e-4)  # `` block``: no blank there
    scores = dict(verdict.category_scores)
    # every later token at 1.0: the named category's path is P(block)
    assert scores["violence"] == pytest.approx(verdict.confidence, abs=1e-4)


def test_the_last_frames_allow_is_not_credited_with_a_line_break_after_it() -> None:
    # the compact grammar ends after the last frame's verdict: ``allow\n`` is forbidden there (the
    # hand-written rule admitted it: 0.7 / 0.9 read where the grammar's share is 0.3 / 0.5)
    raw = {"allow": 0.3, "allow\n": 0.4, "block": 0.2, "\n": 0.1}
    verdict = read("allow", answer_logprobs("allow", "qwen2.5", 10, raw), grammar_masked=False)
    assert verdict.confidence == pytest.approx(0.3 / 0.5, abs=1e-4)


def test_an_earlier_frames_allow_is_credited_with_the_line_break_the_next_frame_needs() -> None:
    raw = {"allow": 0.3, "allow\n": 0.4, "block": 0.2, "\n": 0.1}
    pieces = [*qwen_bpe("qwen2.5").pieces("allow\nallow"), "<|im_end|>"]
    logprobs = [TokenLogprob.from_wire(llamacpp_entry(t, raw if i == 0 else {t: 1.0}, 10))
                for i, t in enumerate(pieces)]
    first, _second = with_confidence(
        parse_engine_output("allow\nallow", None, "stop", frames=2).verdicts, logprobs, "allow\nallow",
        grammar_masked=False, grammar=compact_regex(2),
    )
    assert first.confidence == pytest.approx(0.7 / 0.9, abs=1e-4)


def test_a_block_is_not_credited_with_a_name_no_category_has() -> None:
    # ``block:sexualx``: no category is ``sexualx`` nor begins with it (the hand-written rule admitted it)
    raw = {"block": 0.2, "block:sexualx": 0.3, "allow": 0.5}
    logprobs = answer_logprobs("block:violence", "qwen2.5", 10, raw)
    verdict = read("block:violence", logprobs, grammar_masked=False)
    assert verdict.confidence == pytest.approx(0.2 / 0.7, abs=1e-4)


@pytest.mark.parametrize("vocabulary", FAMILIES)
@pytest.mark.parametrize("answer", ["allow", "block:violence", "review"])
def test_a_raw_list_that_leaves_mass_out_gives_no_confidence_never_a_bound(
    vocabulary: Family, answer: str
) -> None:
    truth = {"allow": 0.2, "block:violence": 0.1, "review": 0.05}[answer] / ADMITTED
    chosen = answer_logprobs(answer, vocabulary, 1, RAW)[0].token
    for k in (10, 6, 5, 4, 3, 2, 1):
        verdict = read(answer, answer_logprobs(answer, vocabulary, k, RAW), grammar_masked=False)
        best = sorted(RAW, key=lambda t: -RAW[t])[:k]
        if set(RAW) <= {*best, chosen}:  # everything listed (the chosen token is always): exact
            assert verdict.confidence == pytest.approx(truth, abs=1e-4)
        else:  # the unlisted mass may be admitted: the field says nothing rather than something lower
            assert verdict.confidence is None, (k, verdict)
            assert note_code(verdict) == UNLISTED_MASS


def test_a_categorys_path_counts_what_the_list_left_out_as_allowed() -> None:
    # at the category's place (``viol``): a forbidden line break, violence, self-harm, a forbidden "The"
    # and hate; each token on the path is its share of 1 minus the listed tokens the grammar forbids there
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


def test_every_admitted_token_at_zero_in_float_gives_no_confidence_and_says_why() -> None:
    # what the tiny model's llama-server does: one forbidden token holds all the float mass
    degenerate = {" " * 128: 1.0, "//---": 0.0, "review": 0.0, "allow": 0.0}
    verdict = read("review", answer_logprobs("review", "qwen2.5", 5, degenerate), grammar_masked=False)
    assert verdict.confidence is None
    assert note_code(verdict) == NOTHING_ADMITTED


def test_no_regex_for_the_grammar_gives_no_confidence_on_a_not_masked_engine() -> None:
    (verdict,) = with_confidence(
        parse_engine_output("allow", None, "stop").verdicts,
        answer_logprobs("allow", "qwen2.5", 10, RAW), "allow", grammar_masked=False,
    )
    assert verdict.confidence is None
    assert note_code(verdict) == NO_GRAMMAR


# the raw softmax at the verdict's first token with the twins a model ranks beside the allowed spellings:
# the grammar admits only `allow` (0.5) and `block` (0.15) here; the twins are forbidden at that place
TWINS = {"allow": 0.5, " allow": 0.1, "allowed": 0.1, "Allow": 0.1, "block": 0.15, "blocked": 0.05}


@pytest.mark.parametrize("vocabulary", FAMILIES)
@pytest.mark.parametrize("k", [6, 5, 4, 3, 2, 1])
def test_twins_the_grammar_forbids_are_left_out_and_a_cut_list_reads_nothing(
    vocabulary: Family, k: int
) -> None:
    verdict = read("allow", answer_logprobs("allow", vocabulary, k, TWINS), grammar_masked=False)
    if k == 6:  # every alternative listed: allow's share of what the grammar admits, the twins left out
        assert verdict.confidence == pytest.approx(0.5 / (0.5 + 0.15), abs=1e-4)
    else:
        assert verdict.confidence is None
        assert note_code(verdict) == UNLISTED_MASS


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


def test_a_place_probe_draws_with_the_seed_it_is_given() -> None:
    wire = wire_for("llamacpp")
    seeds = [wire.place_probe({**compact_body(1), "seed": seed}, "", compact_regex(1)) for seed in (0, 1, 2)]
    assert [probe["seed"] for probe in seeds if probe] == [0, 1, 2]
    assert (wire.place_probe(compact_body(1), "", compact_regex(1)) or {})["seed"] == 0


def test_no_place_probe_where_the_answer_already_is_the_grammars_or_thinking_runs_first() -> None:
    assert wire_for("vllm").place_probe(compact_body(1), "", compact_regex(1)) is None
    assert wire_for("llamacpp").place_probe(compact_body(1, thinking=True), "", compact_regex(1)) is None


def test_the_answers_grammar_is_the_regex_after_the_line_breaks_a_thought_may_leave() -> None:
    assert wire_for("vllm").answer_grammar(compact_body(2)) == compact_regex(2)
    assert wire_for("llamacpp").answer_grammar(compact_body(2)) == compact_regex(2)
    thought = wire_for("llamacpp").answer_grammar(compact_body(1, thinking=True)) or ""
    assert grammar_admits(thought, "\n\nallow")
    assert not grammar_admits(thought, "\n\n\nallow")
    assert wire_for("llamacpp").answer_grammar({"response_format": {"type": "json_schema"}}) is None


def test_a_probed_place_gives_the_confidence_the_raw_softmax_could_not() -> None:
    # the tiny model's raw list (every allowed spelling 0 in float), and what a probe read at the same place
    # after llama.cpp drew again under the grammar: only admitted tokens, summing to 1
    degenerate = {" " * 128: 1.0, "review": 0.0, "allow": 0.0, "block": 0.0}
    logprobs = answer_logprobs("review", "qwen2.5", 4, degenerate)
    parsed = parse_engine_output("review", None, "stop")
    place = (("review", 0.99995), ("allow", 2.6e-5), ("block", 2.4e-5), ("rev", 1e-14))

    def probed(place: tuple[tuple[str, float], ...]) -> Any:
        (verdict,) = with_confidence(parsed.verdicts, logprobs, "review", grammar_masked=False,
                                     grammar=compact_regex(1), places={0: place})
        return verdict

    assert note_code(probed(())) == NOTHING_ADMITTED  # no list: the answer's own reading stands
    assert probed(place).confidence == pytest.approx(0.99995, abs=1e-4)
    assert probed(place).confidence_note is None
    # a probe whose first draw the grammar admitted lists the raw softmax: exact where it lists it all
    raw_place = (("review", 0.5), ("\n", 0.3), ("Review", 0.1), ("allow", 0.1))
    assert probed(raw_place).confidence == pytest.approx(0.5 / 0.6, abs=1e-4)
    # and null where what it leaves out could be admitted (never the lower bound 0.5 / 0.7)
    cut = (("review", 0.5), ("\n", 0.2), ("allow", 0.1))
    assert probed(cut).confidence is None
    assert note_code(probed(cut)) == UNLISTED_MASS


def test_a_probes_list_reads_exact_only_where_nothing_left_out_could_move_it() -> None:
    regex = compact_regex(1)
    assert place_exact((("review", 0.99996), ("allow", 2.1e-5), ("block", 1.9e-5)), "", regex)
    assert not place_exact(((" the", 0.4), ("\n", 0.3), ("Allow", 0.2)), "", regex)  # nothing admitted
    assert not place_exact((("review", 0.6), ("allow", 0.3)), "", regex)  # 0.1 unlisted
    assert not place_exact((), "", regex)
    assert not place_exact(None, "", regex)
    # the second of two frames: read after the first line, under the two-line grammar
    assert place_exact((("allow", 0.7), ("block", 0.3)), "review\n", compact_regex(2))
    assert not place_exact((("allow", 0.7), ("block", 0.3)), "review", compact_regex(2))
