"""Qwen's real BPE (shaping.bpe): the counts the design notes measured, per family, and the chat template."""

from __future__ import annotations

import pytest

from shaping.bpe import DEFAULT_FAMILY, FAMILIES, Family, qwen_bpe

JSON_VERDICT = '{"verdict":"allow","categories":[],"confidence":0.93}'


@pytest.mark.parametrize("family", FAMILIES)
def test_the_verdicts_cost_what_qwens_bpe_says(family: Family) -> None:
    bpe = qwen_bpe(family)
    assert [bpe.count(action) for action in ("allow", "review", "block")] == [1, 1, 1]
    assert bpe.pieces("block:self-harm") == ["block", ":self", "-h", "arm"]  # the colon takes "self"
    assert bpe.pieces("block:violence") == ["block", ":", "viol", "ence"]
    assert bpe.count("block:sexual/minors") == 5
    assert bpe.count("block:violence/graphic") == 6
    assert bpe.count(JSON_VERDICT) == 16
    assert bpe.count("请审核这张视频关键帧截图。") == 8


def test_the_families_differ_in_vocabulary_and_special_ids() -> None:
    qwen2, qwen3 = qwen_bpe("qwen2.5"), qwen_bpe("qwen3.6")
    assert (qwen2.special("<|endoftext|>"), qwen2.special("<think>")) == (151_643, 151_667)
    assert (qwen3.special("<|endoftext|>"), qwen3.special("<think>")) == (248_044, 248_068)
    assert DEFAULT_FAMILY == "qwen3.6"  # the Spark serves a Qwen3.5/3.6-family model


def test_a_special_token_written_in_text_counts_as_one() -> None:
    bpe = qwen_bpe()
    assert bpe.encode("<|im_start|>user\n") == [bpe.special("<|im_start|>"), *bpe.encode("user\n")]


@pytest.mark.parametrize(("thinking", "header"), [(False, 7), (True, 5)])
def test_the_generation_prompt_opens_or_closes_the_think_block(thinking: bool, header: int) -> None:
    # <|im_start|> assistant \n <think> \n (thinking on) or <think> \n\n </think> \n\n (thinking off)
    assert qwen_bpe().count(qwen_bpe().generation_prompt(thinking)) == header


def test_an_unknown_family_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"qwen3\.6, qwen2\.5"):
        qwen_bpe("qwen1")  # type: ignore[arg-type]  # a wrong value on purpose
