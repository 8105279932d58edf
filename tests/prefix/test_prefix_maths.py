"""Prefix planning maths: what the prefix cache can ever reuse, and the block-filling guidance search (for the
system prompt and guidance of each verdict format)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deploy.simulator.tokenizer import render_chat
from shaping.prefix import (
    BlockFill,
    GuidanceTooShort,
    RequestShape,
    cacheable_tokens,
    guidance_pieces,
    guidance_version_for,
    join_pieces,
    load_guidance,
    next_block_boundary,
    plan_prefix,
    shared_prefix_length,
)
from shaping.prompt import SystemPrompt, load_system_prompt, prompt_version_for
from shaping.verdict import VERDICT_FORMATS, VerdictFormat

each_format = pytest.mark.parametrize("verdict_format", VERDICT_FORMATS)


def simulator_shared_prefix(system_text: str) -> int:
    """The simulator's chat template, measured the way the gateway measures an engine."""
    first, second = (render_chat([("system", [system_text]), ("user", [text])], True) for text in ("A", "B"))
    return shared_prefix_length(first, second)  # type: ignore[arg-type]  # pieces compare like ids


def base_prompt(verdict_format: VerdictFormat, guidance: str = "") -> SystemPrompt:
    """The system prompt that asks for ``verdict_format``, with ``guidance`` appended."""
    return load_system_prompt(prompt_version_for(verdict_format), guidance)


def guidance_of(verdict_format: VerdictFormat) -> list[str]:
    """The guidance lines that agree with ``verdict_format``'s prompt."""
    return load_guidance(guidance_version_for(verdict_format))


def fill_with(
    measure: object, block_size: int, lines: list[str] | None = None, verdict_format: VerdictFormat = "json"
) -> tuple[BlockFill, int]:
    """Run the search to the end; answers it and how many measurements it took."""
    assert callable(measure)
    guidance = guidance_of(verdict_format) if lines is None else lines
    search = BlockFill(base_prompt(verdict_format).text, guidance, block_size)
    measured = 0
    while (candidate := search.next_candidate()) is not None:
        search.record(candidate, measure(candidate))
        measured += 1
    return search, measured


def test_the_spark_shape_can_never_hit_and_the_plan_says_why() -> None:
    plan = plan_prefix(RequestShape(shared_prefix_tokens=416, prompt_tokens=1076), block_size=2960)
    assert plan.cacheable_tokens == 0
    assert plan.uncached_tokens == 1076
    assert plan.reason == "shared prefix 416 tokens < block 2,960: no request can hit"
    assert "fill the shared prefix with 2,544 tokens of policy text to 2,960 tokens" in plan.changes[0]
    assert "computes 660 instead of 1,076" in plan.changes[0]


def test_a_small_block_reuses_the_whole_blocks_of_the_shared_prefix() -> None:
    plan = plan_prefix(RequestShape(shared_prefix_tokens=390, prompt_tokens=480), block_size=128)
    assert plan.cacheable_tokens == 384
    assert "its last 6 tokens do not fill a block" in plan.reason
    assert "trim the shared prefix by 6 tokens to 384, or fill it by 122 more to 512" in plan.changes[0]


def test_a_prefix_on_a_block_boundary_needs_no_change() -> None:
    plan = plan_prefix(RequestShape(shared_prefix_tokens=2960, prompt_tokens=3636), block_size=2960)
    assert plan.cacheable_tokens == 2960
    assert plan.uncached_tokens == 676
    assert plan.changes == ()


def test_the_last_prompt_token_is_never_served_from_the_cache() -> None:
    assert cacheable_tokens(shared_prefix_tokens=256, prompt_tokens=256, block_size=128) == 128
    assert cacheable_tokens(shared_prefix_tokens=256, prompt_tokens=257, block_size=128) == 256


def test_packed_frames_share_the_prefix_cost() -> None:
    plan = plan_prefix(RequestShape(shared_prefix_tokens=416, prompt_tokens=416 + 4 * 662, frames=4), 2960)
    assert plan.uncached_tokens_per_frame == pytest.approx((416 + 4 * 662) / 4)
    assert "(662 per keyframe)" in plan.changes[0]


@given(shared=st.integers(0, 20_000), extra=st.integers(0, 20_000), block=st.integers(1, 4096))
def test_cacheable_tokens_are_whole_shared_blocks_short_of_the_last_token(
    shared: int, extra: int, block: int
) -> None:
    prompt = shared + extra
    cached = cacheable_tokens(shared, prompt, block)
    assert cached % block == 0
    assert cached <= shared
    assert cached <= max(0, prompt - 1)
    assert cached + block > min(shared, max(0, prompt - 1))  # no further whole block would fit


def test_the_shared_prefix_is_the_leading_ids_in_common() -> None:
    assert shared_prefix_length([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert shared_prefix_length([1, 2], [1, 2, 3]) == 2
    assert shared_prefix_length([], [1]) == 0


def test_the_block_boundary_is_the_next_whole_block() -> None:
    assert next_block_boundary(382, 2960) == 2960
    assert next_block_boundary(2960, 2960) == 2960
    assert next_block_boundary(2961, 2960) == 5920


@each_format
def test_the_guidance_file_is_policy_text_cut_only_after_clause_marks(verdict_format: VerdictFormat) -> None:
    lines = guidance_of(verdict_format)
    assert lines
    assert not any(line.startswith("#") for line in lines)
    pieces = guidance_pieces(lines)
    assert join_pieces(pieces) == "\n".join(lines)
    ends = {piece[-1] for _, piece in pieces}
    assert ends <= set("。；！？;.!?：:，,") | {line[-1] for line in lines}


@each_format
def test_the_fill_lands_the_shared_prefix_on_the_spark_block(verdict_format: VerdictFormat) -> None:
    search, measured = fill_with(simulator_shared_prefix, 2960, verdict_format=verdict_format)
    filled = search.result()
    assert filled.base_shared_tokens == simulator_shared_prefix(base_prompt(verdict_format).text)
    assert filled.target_tokens == 2960
    assert 0 <= filled.overshoot < 20  # cut after a clause mark: a few tokens past the boundary at most
    assert simulator_shared_prefix(filled.system_text) == filled.shared_tokens
    assert measured <= 14  # a binary search, not a token count per line


@each_format
def test_the_filled_prompt_is_what_load_system_prompt_builds_from_the_guidance(
    verdict_format: VerdictFormat,
) -> None:
    filled = fill_with(simulator_shared_prefix, 2960, verdict_format=verdict_format)[0].result()
    assert base_prompt(verdict_format, filled.guidance).text == filled.system_text
    assert filled.system_text.startswith(base_prompt(verdict_format).text)
    assert "\n".join(guidance_of(verdict_format)).startswith(filled.guidance)


@each_format
@pytest.mark.parametrize("block", [16, 128, 500, 1024])
def test_the_fill_reaches_the_next_boundary_with_the_least_guidance(
    block: int, verdict_format: VerdictFormat
) -> None:
    search = fill_with(simulator_shared_prefix, block, verdict_format=verdict_format)[0]
    filled = search.result()
    assert filled.target_tokens == next_block_boundary(filled.base_shared_tokens, block)
    assert filled.shared_tokens >= filled.target_tokens
    fewer = guidance_pieces(guidance_of(verdict_format))
    used = len(guidance_pieces(filled.guidance.split("\n")))
    if used:
        shorter = base_prompt(verdict_format, join_pieces(fewer[: used - 1])).text
        assert simulator_shared_prefix(shorter) < filled.target_tokens  # one piece less falls short


@each_format
def test_all_the_guidance_fills_the_sparks_block_with_a_fifth_to_spare(verdict_format: VerdictFormat) -> None:
    # The contract the fill relies on: the guidance reaches the Spark's 2,960-token block from its own prompt,
    # with room for a tokenizer that counts fewer tokens than the simulator's (or a longer prompt).
    whole = base_prompt(verdict_format, "\n".join(guidance_of(verdict_format))).text
    assert simulator_shared_prefix(whole) >= 1.2 * 2960


@each_format
def test_a_prefix_already_on_a_boundary_gets_no_guidance(verdict_format: VerdictFormat) -> None:
    base = simulator_shared_prefix(base_prompt(verdict_format).text)
    filled = fill_with(simulator_shared_prefix, base, verdict_format=verdict_format)[0].result()
    assert filled.guidance == ""
    assert filled.added_tokens == 0


def test_too_little_guidance_is_said_plainly() -> None:
    search, _ = fill_with(simulator_shared_prefix, 2960, lines=["只有一句补充说明。"])
    with pytest.raises(GuidanceTooShort, match="short of the 2,960-token block boundary"):
        search.result()


def test_a_measurement_must_answer_the_candidate_proposed() -> None:
    search = BlockFill(load_system_prompt().text, load_guidance(), 2960)
    with pytest.raises(ValueError, match="candidate"):
        search.record("some other prompt", 100)
    with pytest.raises(RuntimeError, match="not finished"):
        search.result()
