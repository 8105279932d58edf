"""Image token accounting for Qwen-VL engines: the size the engine resizes an image to, and its tokens.

A Qwen-VL processor resizes every image with ``smart_resize`` before the vision encoder sees it: each side
is rounded to a multiple of the factor (28 pixels for Qwen2.5-VL, 32 for Qwen3-VL), then the whole image is
scaled down or up to stay within ``[min_pixels, max_pixels]``. Each factor×factor square becomes one image
token. The gateway shapes frames to exactly that size, with ``max_pixels`` capped by a token budget, so the
engine resizes nothing and the token count is known before the request leaves. The engine simulator runs
the same function on arrival.

Note the argument order: ``(width, height)`` as Pillow says it, where Qwen's code takes ``(height, width)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shaping.errors import ImageAspectRatioTooLarge

MAX_ASPECT_RATIO = 200
"""Qwen-VL processors refuse images longer than 200:1; so does ``smart_resize`` here."""

# Qwen3-VL's preprocessor defaults (patch 16, merge 2): shortest_edge 65,536 and longest_edge 16,777,216
# pixels, i.e. 64 to 16,384 tokens. Qwen2.5-VL (patch 14, merge 2): 4 to 16,384 tokens of 28×28 pixels.
_QWEN3_VL = (32, 64 * 32 * 32, 16384 * 32 * 32)
_QWEN2_5_VL = (28, 4 * 28 * 28, 16384 * 28 * 28)


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenGrid:
    """How an engine turns pixels into image tokens, and how many tokens a frame may cost.

    ``pixels_per_token`` is the side of the square one token covers (the resize factor). ``min_pixels`` and
    ``max_pixels`` mirror the engine processor's limits: a shaped frame is exact only if the engine's own
    range contains ours, so the defaults are Qwen3-VL's. ``token_budget`` caps the tokens of one frame
    (``None``: no cap beyond ``max_pixels``, i.e. the engine's own behaviour, for the simulator).

    The default budget, 660, is the production figure: 660 image tokens per keyframe (1,076 prompt tokens
    with the 416-token system prompt) is what the Spark's throughput and TTFT were measured with and what
    verdict quality was judged on. A 16:9 frame lands on 1088×608 = 646 tokens. With thinking off the
    engine is prefill-bound, so a smaller budget buys throughput almost linearly, but it changes what the
    model sees: lower it only after the quality module has measured verdict agreement at the new budget.
    Keep the budget at least :func:`smallest_honoured_budget` (twice ``min_pixels`` in tokens): rounding
    down to whole tokens can land a narrow frame at just over half its budget, and under ``min_pixels`` the
    engine would upscale it and count more tokens. The gateway's settings refuse a smaller budget.
    """

    pixels_per_token: int = _QWEN3_VL[0]
    min_pixels: int = _QWEN3_VL[1]
    max_pixels: int = _QWEN3_VL[2]
    token_budget: int | None = 660

    def __post_init__(self) -> None:
        factor = self.pixels_per_token
        if factor < 1:
            raise ValueError(f"pixels_per_token must be at least 1, got {factor}")
        if self.min_pixels < 1:
            raise ValueError(f"min_pixels must be at least 1, got {self.min_pixels}")
        if self.max_pixels < factor * factor:
            raise ValueError(
                f"max_pixels must hold at least one {factor}×{factor} token, got {self.max_pixels:,}"
            )
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"token_budget must be at least 1 token, got {self.token_budget}")
        if self.min_pixels > self.effective_max_pixels:
            # Below the engine's min_pixels the engine would upscale what we send: not our count any more.
            min_tokens = math.ceil(self.min_pixels / factor**2)
            raise ValueError(
                f"the budget allows at most {self.effective_max_pixels:,} pixels per frame, below the "
                f"engine's min_pixels {self.min_pixels:,} ({min_tokens} tokens): raise token_budget or lower "
                "min_pixels"
            )

    @property
    def effective_max_pixels(self) -> int:
        """The most pixels a frame may have: ``max_pixels``, capped by the token budget."""
        if self.token_budget is None:
            return self.max_pixels
        return min(self.max_pixels, self.token_budget * self.pixels_per_token**2)

    @classmethod
    def qwen3_vl(cls, *, token_budget: int | None = 660) -> TokenGrid:
        """Qwen3-VL's processor defaults: 32-pixel tokens, 64 to 16,384 tokens per image."""
        factor, min_pixels, max_pixels = _QWEN3_VL
        return cls(
            pixels_per_token=factor, min_pixels=min_pixels, max_pixels=max_pixels, token_budget=token_budget
        )

    @classmethod
    def qwen2_5_vl(cls, *, token_budget: int | None = 660) -> TokenGrid:
        """Qwen2.5-VL's processor defaults: 28-pixel tokens, 4 to 16,384 tokens per image."""
        factor, min_pixels, max_pixels = _QWEN2_5_VL
        return cls(
            pixels_per_token=factor, min_pixels=min_pixels, max_pixels=max_pixels, token_budget=token_budget
        )


def smart_resize(width: int, height: int, grid: TokenGrid) -> tuple[int, int]:
    """The ``(width, height)`` a Qwen-VL engine resizes a ``width``×``height`` image to, within the budget.

    Mirrors ``transformers``' Qwen2-VL ``smart_resize`` (what vLLM runs) step for step, including Python's
    round-half-to-even, with ``max_pixels`` replaced by :attr:`TokenGrid.effective_max_pixels`. Two
    additions, for corner cases only, so that a frame shaped to the result is one the engine takes as is:
    where Qwen's rounding would overshoot that maximum (a side clamped up to one token at extreme aspect
    ratios, or ``min_pixels`` close to the budget), the image's longer side is cut back to fit; and where it
    would round a 200:1 image past 200:1 (which the engine refuses on arrival), the longer side is cut to
    200 times the shorter. Symmetric: swapping width and height swaps the result.

    Raises :class:`~shaping.errors.ImageAspectRatioTooLarge` beyond 200:1, as the engine would refuse it.
    """
    if width < 1 or height < 1:
        raise ValueError(f"an image has at least one pixel a side, got {width}×{height}")
    longer, shorter = max(width, height), min(width, height)
    if longer / shorter > MAX_ASPECT_RATIO:
        raise ImageAspectRatioTooLarge(
            f"the image is {width}×{height} pixels, an aspect ratio of {longer / shorter:,.0f}:1, "
            f"over the {MAX_ASPECT_RATIO}:1 the model accepts"
        )
    factor = grid.pixels_per_token
    max_pixels = grid.effective_max_pixels
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < grid.min_pixels:
        beta = math.sqrt(grid.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    if h_bar * w_bar > max_pixels:
        if width == height:
            w_bar = h_bar = max(factor, math.isqrt(max_pixels) // factor * factor)
        elif width > height:
            w_bar, h_bar = _fit_longer_side(w_bar, h_bar, factor, max_pixels)
        else:
            h_bar, w_bar = _fit_longer_side(h_bar, w_bar, factor, max_pixels)
    if w_bar > MAX_ASPECT_RATIO * h_bar:
        w_bar = MAX_ASPECT_RATIO * h_bar
    elif h_bar > MAX_ASPECT_RATIO * w_bar:
        h_bar = MAX_ASPECT_RATIO * w_bar
    return w_bar, h_bar


def _fit_longer_side(longer: int, shorter: int, factor: int, max_pixels: int) -> tuple[int, int]:
    """Cut the longer side (then, if one token of it is still too much, the shorter) to fit ``max_pixels``."""
    longer = max(factor, max_pixels // shorter // factor * factor)
    if longer * shorter > max_pixels:
        shorter = max(factor, max_pixels // longer // factor * factor)
    return longer, shorter


def smallest_honoured_budget(grid: TokenGrid) -> int:
    """The smallest token budget at which no frame :func:`smart_resize` shapes falls under ``min_pixels``.

    Under ``min_pixels`` the engine enlarges what it is sent, so it counts more tokens than predicted (at
    budget 126 a 63×2032 frame shapes to 32×2016, 63 tokens; the engine makes it 64×2048, 128). Over the
    budget ``smart_resize`` scales both sides by one factor, to a×b = B tokens in real numbers, then floors
    each side to whole tokens. The worst case is a side just short of k + 1 tokens: it keeps k, and the
    other side keeps ``floor(B / (k + 1))``. So the fewest tokens a budget B can leave is the least
    ``k × floor(B / (k + 1))`` over k, and the floor is the first B at which that reaches ``min_pixels``
    in tokens (m): 2m (128 for Qwen3-VL's 64-token minimum), where k = 1, a frame under 2 tokens wide,
    keeps just over half the budget. ``grid.token_budget`` is not used.
    """
    min_tokens = math.ceil(grid.min_pixels / grid.pixels_per_token**2)

    def fewest_tokens(budget: int) -> int:
        kept = [k * (budget // (k + 1)) for k in range(1, budget) if budget // (k + 1) >= 1]
        return min([budget, *kept])  # a side under one token is raised to one: never the fewest

    budget = max(1, min_tokens)
    while fewest_tokens(budget) < min_tokens:
        budget += 1
    return budget


def image_tokens(width: int, height: int, grid: TokenGrid) -> int:
    """How many image tokens a ``width``×``height`` image costs on this grid."""
    w_bar, h_bar = smart_resize(width, height, grid)
    return (w_bar // grid.pixels_per_token) * (h_bar // grid.pixels_per_token)
