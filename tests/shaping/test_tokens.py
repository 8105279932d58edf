"""Token accounting: smart_resize mirrors Qwen-VL's processor and never exceeds the budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shaping.errors import ImageAspectRatioTooLarge, ImageRejected
from shaping.tokens import MAX_ASPECT_RATIO, TokenGrid, image_tokens, smart_resize


def transformers_smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The oracle: transformers' Qwen2-VL smart_resize as vLLM runs it, (height, width) order and all."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@st.composite
def grids(draw: st.DrawFn) -> TokenGrid:
    factor = draw(st.sampled_from([28, 32, 14, 16]))
    min_tokens = draw(st.integers(1, 256))
    budget = draw(st.one_of(st.none(), st.integers(min_tokens, 20_000)))
    max_tokens = draw(st.integers(min_tokens, 20_000))
    return TokenGrid(
        pixels_per_token=factor,
        min_pixels=draw(st.integers((min_tokens - 1) * factor**2 + 1, min_tokens * factor**2)),
        max_pixels=max_tokens * factor**2,
        token_budget=budget,
    )


@st.composite
def sizes(draw: st.DrawFn) -> tuple[int, int]:
    width = draw(st.integers(1, 20_000))
    height = draw(
        st.integers(max(1, math.ceil(width / MAX_ASPECT_RATIO)), min(20_000, width * MAX_ASPECT_RATIO))
    )
    return width, height


def test_a_720p_frame_lands_on_1088_by_608_at_the_default_budget() -> None:
    assert smart_resize(1280, 720, TokenGrid()) == (1088, 608)
    assert image_tokens(1280, 720, TokenGrid()) == 646


def test_a_1080p_frame_lands_on_the_same_grid_as_a_720p_one() -> None:
    assert smart_resize(1920, 1080, TokenGrid()) == (1088, 608)


def test_the_qwen2_5_vl_grid_uses_28_pixel_tokens() -> None:
    grid = TokenGrid.qwen2_5_vl()
    assert smart_resize(1280, 720, grid) == (952, 532)
    assert image_tokens(1280, 720, grid) == 34 * 19


def test_without_a_budget_each_side_rounds_half_to_even_as_python_does() -> None:
    # 720 / 32 = 22.5 rounds to 22, as Qwen's round() does: 704, not 736.
    assert smart_resize(1280, 720, TokenGrid(token_budget=None)) == (1280, 704)


def test_a_small_image_is_scaled_up_to_the_engine_minimum() -> None:
    assert smart_resize(100, 100, TokenGrid.qwen3_vl()) == (256, 256)
    assert image_tokens(100, 100, TokenGrid.qwen3_vl()) == 64


def test_a_frame_already_on_the_grid_keeps_its_size() -> None:
    assert smart_resize(1088, 608, TokenGrid()) == (1088, 608)


def test_an_aspect_ratio_over_200_to_1_is_refused_as_the_model_would() -> None:
    with pytest.raises(ImageAspectRatioTooLarge) as caught:
        smart_resize(2010, 10, TokenGrid())
    assert isinstance(caught.value, ImageRejected)
    assert (caught.value.code, caught.value.status) == ("image_aspect_ratio_too_large", 422)
    assert "2010×10" in caught.value.message


def test_an_aspect_ratio_of_exactly_200_to_1_is_accepted() -> None:
    width, height = smart_resize(6400, 32, TokenGrid())
    assert width % 32 == 0
    assert height % 32 == 0


def test_rounding_never_pushes_a_200_to_1_image_past_200_to_1() -> None:
    # Qwen's rounding gives 5628×28 (201:1) here, which the engine would refuse if we sent it.
    grid = TokenGrid(pixels_per_token=28, min_pixels=784, max_pixels=28 * 28 * 16384, token_budget=None)
    assert transformers_smart_resize(29, 5615, 28, 784, grid.max_pixels) == (28, 5628)
    width, height = smart_resize(5615, 29, grid)
    assert width <= 200 * height


def test_a_size_without_pixels_is_a_programming_error_not_a_client_one() -> None:
    with pytest.raises(ValueError, match="at least one pixel"):
        smart_resize(0, 10, TokenGrid())


def test_a_budget_below_the_engine_minimum_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="min_pixels"):
        TokenGrid(token_budget=32)  # Qwen3-VL never goes below 64 tokens


def test_a_budget_of_zero_tokens_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="token_budget"):
        TokenGrid(min_pixels=1, token_budget=0)


def test_an_extreme_aspect_ratio_stays_within_a_tiny_budget() -> None:
    # Qwen's own rounding clamps the short side up to one token and would give 28 tokens here.
    grid = TokenGrid(pixels_per_token=32, min_pixels=1024, max_pixels=16_777_216, token_budget=4)
    width, height = smart_resize(200, 1, grid)
    assert (width // 32) * (height // 32) <= 4
    qwen_h, qwen_w = transformers_smart_resize(1, 200, 32, 1024, 4 * 1024)
    assert qwen_h * qwen_w > 4 * 1024


@given(grid=grids(), size=sizes())
def test_smart_resize_always_gives_whole_tokens_within_the_budget(
    grid: TokenGrid, size: tuple[int, int]
) -> None:
    width, height = smart_resize(*size, grid)
    factor = grid.pixels_per_token
    assert width % factor == 0
    assert height % factor == 0
    assert width >= factor
    assert height >= factor
    assert width * height <= grid.effective_max_pixels
    if grid.token_budget is not None:
        assert image_tokens(*size, grid) <= grid.token_budget


@given(grid=grids(), size=sizes())
def test_smart_resize_matches_transformers_wherever_that_stays_within_the_budget(
    grid: TokenGrid, size: tuple[int, int]
) -> None:
    width, height = size
    expected_h, expected_w = transformers_smart_resize(
        height, width, grid.pixels_per_token, grid.min_pixels, grid.effective_max_pixels
    )
    assume(expected_h * expected_w <= grid.effective_max_pixels)
    assume(max(expected_h, expected_w) <= MAX_ASPECT_RATIO * min(expected_h, expected_w))
    assert smart_resize(width, height, grid) == (expected_w, expected_h)


@given(grid=grids(), size=sizes())
def test_smart_resize_is_symmetric_under_rotation(grid: TokenGrid, size: tuple[int, int]) -> None:
    width, height = smart_resize(*size, grid)
    assert smart_resize(size[1], size[0], grid) == (height, width)


@given(grid=grids(), size=sizes())
def test_a_shaped_frame_is_never_longer_than_the_engine_accepts(
    grid: TokenGrid, size: tuple[int, int]
) -> None:
    width, height = smart_resize(*size, grid)
    assert max(width, height) <= MAX_ASPECT_RATIO * min(width, height)


@given(grid=grids(), size=sizes())
def test_the_engine_resizes_nothing_a_shaped_frame_already_fits(
    grid: TokenGrid, size: tuple[int, int]
) -> None:
    width, height = smart_resize(*size, grid)
    assume(width * height >= grid.min_pixels)  # only an impossible budget/minimum pair can break this
    engine = TokenGrid(
        pixels_per_token=grid.pixels_per_token,
        min_pixels=grid.min_pixels,
        max_pixels=grid.max_pixels,
        token_budget=None,
    )
    assert smart_resize(width, height, engine) == (width, height)
    assert image_tokens(width, height, engine) == image_tokens(*size, grid)
