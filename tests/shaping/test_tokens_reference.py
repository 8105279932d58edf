"""The gateway's image-token counts against the reference: ``transformers``' Qwen-VL image processor.

The gateway shapes a frame so that the engine resizes nothing, and counts its tokens before the request
leaves (``shaping.tokens``). Checked here against the processor a Qwen-VL engine runs (vLLM calls the
model's Hugging Face processor): its PIL backend, which needs no torch, configured as the models'
``preprocessor_config.json`` has it (Qwen3-VL: patch 16, merge 2, 64 to 16,384 tokens of 32×32 pixels;
Qwen2.5-VL: patch 14, merge 2, 4 to 16,384 tokens of 28×28). The processor never sees our token budget,
only the shaped frame, as the engine would.
"""

from __future__ import annotations

import io
import itertools
import logging

import numpy as np
import pytest
from PIL import Image

from deploy.keyframes import make_keyframe
from shaping.image import ImageLimits, shape_image
from shaping.tokens import TokenGrid, image_tokens, smart_resize

logging.getLogger("transformers").setLevel(logging.ERROR)  # "PyTorch was not found": the PIL path needs none
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (  # noqa: E402 - after quieting its logger
    Qwen2VLImageProcessorPil,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (  # noqa: E402 - after quieting its logger
    smart_resize as reference_smart_resize,
)

MERGE = 2
PROCESSORS = {
    "qwen3-vl": (
        Qwen2VLImageProcessorPil(
            patch_size=16, merge_size=MERGE, temporal_patch_size=2,
            size={"shortest_edge": 64 * 32 * 32, "longest_edge": 16384 * 32 * 32},
        ),
        TokenGrid.qwen3_vl,
    ),
    "qwen2.5-vl": (
        Qwen2VLImageProcessorPil(
            patch_size=14, merge_size=MERGE, temporal_patch_size=2,
            size={"shortest_edge": 4 * 28 * 28, "longest_edge": 16384 * 28 * 28},
        ),
        TokenGrid.qwen2_5_vl,
    ),
}
# Keyframes as cameras and phones make them, and awkward ones: portrait, panoramas, slivers, tiny, odd.
SIZES = [
    (1280, 720), (1920, 1080), (720, 1280), (1056, 640), (640, 360), (2560, 1080), (1080, 1350),
    (333, 777), (4000, 300), (300, 4000), (2000, 100), (64, 64), (97, 61), (3000, 25),
]
BUDGETS = [128, 330, 660, 4096]


def source_jpeg(width: int, height: int) -> bytes:
    """A photo-like keyframe, or noise where the keyframe renderer needs more room than a sliver has."""
    if min(width, height) >= 100:
        return make_keyframe("allow", width, height, seed=width * 7 + height)
    noise = np.random.default_rng(width * 7 + height).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def reference_tokens(processor: Qwen2VLImageProcessorPil, image: Image.Image) -> int:
    """Image tokens the processor gives an image: its patch grid, merge × merge patches to a token."""
    grid = processor(images=[image], return_tensors="np")["image_grid_thw"]
    t, h, w = (int(v) for v in np.asarray(grid)[0])
    return t * h * w // (MERGE * MERGE)


@pytest.mark.parametrize("model", sorted(PROCESSORS))
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_a_shaped_frame_costs_what_the_reference_processor_counts(
    model: str, width: int, height: int
) -> None:
    processor, grid_for = PROCESSORS[model]
    source = source_jpeg(width, height)
    for budget in BUDGETS:
        shaped = shape_image(source, ImageLimits(), grid_for(token_budget=budget))
        with Image.open(io.BytesIO(shaped.data)) as frame:
            frame.load()
            assert frame.size == (shaped.width, shaped.height)
            counted = reference_tokens(processor, frame)
        assert shaped.image_tokens == counted, (model, width, height, budget, shaped.width, shaped.height)
        assert shaped.image_tokens <= budget


@pytest.mark.parametrize("model", sorted(PROCESSORS))
def test_an_unshaped_image_costs_what_the_reference_processor_counts(model: str) -> None:
    processor, grid_for = PROCESSORS[model]
    grid = grid_for(token_budget=None)  # the engine's own limits: what the simulator charges on arrival
    for width, height in SIZES[:8]:
        image = Image.new("RGB", (width, height), (90, 120, 150))
        assert image_tokens(width, height, grid) == reference_tokens(processor, image), (width, height)


@pytest.mark.parametrize(("model", "factor"), [("qwen3-vl", 32), ("qwen2.5-vl", 28)])
def test_smart_resize_is_the_references_wherever_the_reference_stays_in_bounds(
    model: str, factor: int
) -> None:
    _, grid_for = PROCESSORS[model]
    checked = 0
    for budget, width, height in itertools.product(
        (128, 330, 660, 2048), range(17, 2400, 37), range(13, 1500, 41)
    ):
        if max(width, height) / min(width, height) > 200:
            continue
        grid = grid_for(token_budget=budget)
        ref_h, ref_w = reference_smart_resize(
            height, width, factor=factor, min_pixels=grid.min_pixels, max_pixels=grid.effective_max_pixels
        )
        if ref_h * ref_w > grid.effective_max_pixels or max(ref_h, ref_w) > 200 * min(ref_h, ref_w):
            continue  # the documented corner cases, where ours cuts back to stay within the budget
        assert smart_resize(width, height, grid) == (ref_w, ref_h), (budget, width, height)
        checked += 1
    assert checked > 4000
