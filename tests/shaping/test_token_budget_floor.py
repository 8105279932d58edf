"""The smallest token budget the engine honours: below it a shaped frame can fall under the engine's
min_pixels, and the engine enlarges it (so its tokens are not the ones predicted)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shaping.tokens import TokenGrid, image_tokens, smallest_honoured_budget, smart_resize


def engine_grid(pixels_per_token: int) -> TokenGrid:
    """The engine's own processor: the same grid and min_pixels, no budget of ours."""
    return TokenGrid(pixels_per_token=pixels_per_token, token_budget=None)


def frames() -> Iterator[tuple[int, int]]:
    """Narrow frames up to 200:1 (where whole-token rounding loses most), every width to 128 pixels."""
    for width in range(1, 129):
        for height in range(width, min(200 * width, 3000) + 1, max(1, width // 12)):
            yield width, height


def enlarged_by_the_engine(budget: int, pixels_per_token: int) -> Iterator[tuple[int, int]]:
    """Frames whose shaped size the engine does not take as it is."""
    ours = TokenGrid(pixels_per_token=pixels_per_token, token_budget=budget)
    engine = engine_grid(pixels_per_token)
    for width, height in frames():
        shaped = smart_resize(width, height, ours)
        if smart_resize(*shaped, engine) != shaped:
            yield width, height


def test_the_issues_frame_shapes_under_min_pixels_at_budget_126_and_the_engine_makes_128_tokens() -> None:
    shaped = smart_resize(63, 2032, TokenGrid(token_budget=126))

    assert image_tokens(63, 2032, TokenGrid(token_budget=126)) == 63
    assert image_tokens(*shaped, engine_grid(32)) == 128


@pytest.mark.parametrize(
    ("grid", "minimum_tokens"), [(engine_grid(32), 64), (TokenGrid.qwen2_5_vl(token_budget=None), 4)]
)
def test_the_smallest_budget_is_twice_the_engines_minimum_tokens(
    grid: TokenGrid, minimum_tokens: int
) -> None:
    assert grid.min_pixels == minimum_tokens * grid.pixels_per_token**2
    assert smallest_honoured_budget(grid) == 2 * minimum_tokens


@pytest.mark.parametrize("pixels_per_token", [32, 28])
def test_at_the_smallest_budget_the_engine_takes_every_shaped_frame_as_it_is(pixels_per_token: int) -> None:
    smallest = smallest_honoured_budget(engine_grid(pixels_per_token))

    assert list(enlarged_by_the_engine(smallest, pixels_per_token)) == []


@pytest.mark.parametrize("pixels_per_token", [32, 28])
def test_one_token_below_the_smallest_budget_the_engine_enlarges_some_frames(pixels_per_token: int) -> None:
    smallest = smallest_honoured_budget(engine_grid(pixels_per_token))

    enlarged = next(enlarged_by_the_engine(smallest - 1, pixels_per_token), None)

    assert enlarged is not None
    width, height = enlarged
    ours = TokenGrid(pixels_per_token=pixels_per_token, token_budget=smallest - 1)
    shaped = smart_resize(width, height, ours)
    assert shaped[0] * shaped[1] < ours.min_pixels
