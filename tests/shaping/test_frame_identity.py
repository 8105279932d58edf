"""The frame identity (pHash, colour thumbnail) from the 8×-reduced frame, and the fast path's safety checks.

The identity used to be computed on the full shaped frame (pHash) and from a second, DCT-scaled decode of
the shaped JPEG (thumbnail). It now comes from the shaped pixels box-reduced 8×, or for a passed-through
frame from its 1/8-scale decode; these tests bound how far that lands from the full-frame values.
"""

from __future__ import annotations

import io
import struct

import imagehash
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from deploy.keyframes import LABELS, make_keyframe, render_keyframe
from shaping.errors import ImageDecodeFailed, ImageDimensionsTooLarge, ImageRejected
from shaping.image import THUMBNAIL_SIZE, ImageLimits, ShapedImage, shape_image
from shaping.image.jpeg import jpeg_segments
from shaping.tokens import TokenGrid

LIMITS = ImageLimits()
GRID = TokenGrid()
ON_GRID = make_keyframe("allow", 1088, 608, seed=1)  # passes through
# Sizes around the grid: on it (passthrough), 2× it (DCT half scale), off it, portrait, square, small.
SIZES = [(1088, 608), (1280, 720), (1920, 1080), (2176, 1216), (1056, 640), (720, 1280), (1000, 1000),
         (640, 360), (800, 600)]


def full_identity(shaped: ShapedImage) -> tuple[imagehash.ImageHash, np.ndarray]:
    """pHash and exact 16×9 cell means of the whole shaped frame, decoded at full size."""
    with Image.open(io.BytesIO(shaped.data)) as image:
        pixels = image.convert("RGB")
    cells = np.asarray(pixels.resize(THUMBNAIL_SIZE, Image.Resampling.BOX), dtype=np.int16)
    return imagehash.phash(pixels), cells.reshape(-1)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    label=st.sampled_from(LABELS),
    size=st.sampled_from(SIZES),
    seed=st.integers(0, 10**6),
    quality=st.sampled_from([50, 70, 85, 90, 95]),
)
def test_the_reduced_identity_is_within_the_near_duplicate_rule_of_the_full_one(
    label: str, size: tuple[int, int], seed: int, quality: int
) -> None:
    shaped = shape_image(make_keyframe(label, *size, seed=seed, quality=quality), LIMITS, GRID)
    full_hash, full_cells = full_identity(shaped)
    # The near-duplicate rule allows 4 bits and 32 levels between two frames identified alike. Against the
    # full frame the reduction stays within 2 bits and 24 levels: at 1/8 scale a thumbnail cell's edge can
    # fall inside a reduced pixel, so a sharp edge next to it moves the cell mean a little.
    assert full_hash - imagehash.hex_to_hash(shaped.phash) <= 2
    reduced_cells = np.frombuffer(shaped.thumbnail, dtype=np.uint8).astype(np.int16)
    assert int(np.abs(full_cells - reduced_cells).max()) <= 24


def test_the_identity_is_made_from_an_eighth_of_the_frame_each_way() -> None:
    passthrough = shape_image(make_keyframe("allow", 1088, 608, seed=4), LIMITS, GRID)
    shaped = shape_image(make_keyframe("allow", 1280, 720, seed=4), LIMITS, GRID)
    assert passthrough.passthrough
    assert passthrough.decoded_size == (136, 76)  # the DC terms only: 1/64 of the pixels
    assert not shaped.passthrough
    assert shaped.decoded_size == (1280, 720)  # 0.85× the target: no DCT scale covers it
    assert len(passthrough.thumbnail) == len(shaped.thumbnail) == 16 * 9 * 3


def test_a_frame_twice_the_target_is_decoded_at_half_scale_only() -> None:
    shaped = shape_image(make_keyframe("allow", 2176, 1216, seed=4), LIMITS, GRID)
    assert (shaped.decoded_size, shaped.width, shaped.height) == ((1088, 608), 1088, 608)


def test_the_violence_markers_still_part_a_scene_the_phash_calls_the_same() -> None:
    # pHash puts the allow scene and the same scene with its violence markers 2 bits apart (grey levels at
    # 32×32 barely see two corner squares); the reduced thumbnail must still see them.
    scene = shape_image(make_keyframe("allow", seed=21), LIMITS, GRID)
    marked = shape_image(make_keyframe("block:violence", seed=21), LIMITS, GRID)
    distance = imagehash.hex_to_hash(scene.phash) - imagehash.hex_to_hash(marked.phash)
    assert distance <= 4
    delta = np.abs(
        np.frombuffer(scene.thumbnail, np.uint8).astype(np.int16)
        - np.frombuffer(marked.thumbnail, np.uint8).astype(np.int16)
    ).max()
    assert delta > 100


def test_a_passed_through_frame_and_its_re_encoding_share_an_identity() -> None:
    picture = render_keyframe("allow", 1088, 608, seed=8)
    identities = []
    for quality in (90, 70):
        buffer = io.BytesIO()
        picture.save(buffer, "JPEG", quality=quality)
        identities.append(shape_image(buffer.getvalue(), LIMITS, GRID))
    first, second = identities
    assert first.passthrough
    assert second.passthrough
    assert first.sha256 != second.sha256
    assert imagehash.hex_to_hash(first.phash) - imagehash.hex_to_hash(second.phash) <= 4


# --- the fast path keeps every safety check -------------------------------------------------------------


def _with_second_frame_header(data: bytes, height: int) -> bytes:
    """The JPEG with a copy of its SOF0 saying another height inserted right after the first."""
    sof = next(segment for segment in jpeg_segments(data) if segment.marker == 0xC0)
    body = data[sof.start : sof.end]
    return data[: sof.end] + body[:5] + struct.pack(">H", height) + body[7:] + data[sof.end :]


@pytest.mark.parametrize("height", [304, 1216])
def test_an_on_grid_jpeg_whose_second_frame_header_disagrees_is_refused_before_decoding(height: int) -> None:
    reads = r"header states 1088×608 pixels, but the image reads as 1088×"
    with pytest.raises(ImageDecodeFailed, match=reads):
        shape_image(_with_second_frame_header(ON_GRID, height), LIMITS, GRID)


def test_an_on_grid_jpeg_whose_second_frame_header_is_a_bomb_is_refused() -> None:
    with pytest.raises((ImageDecodeFailed, ImageDimensionsTooLarge)):
        shape_image(_with_second_frame_header(ON_GRID, 65000), LIMITS, GRID)


def _full_decode_succeeds(data: bytes, size: tuple[int, int]) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.size == size
    except (OSError, SyntaxError, ValueError, EOFError, struct.error):
        return False


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    changes=st.lists(
        st.tuples(st.integers(2, len(ON_GRID) - 1), st.integers(0, 255)), min_size=1, max_size=4
    ),
    cut=st.one_of(st.none(), st.integers(2, len(ON_GRID) - 1)),
)
def test_an_on_grid_jpeg_damaged_anywhere_is_refused_whenever_a_full_decode_fails(
    changes: list[tuple[int, int]], cut: int | None
) -> None:
    damaged = bytearray(ON_GRID)
    for position, value in changes:
        damaged[position] = value
    data = bytes(damaged[:cut])
    try:
        shape_image(data, LIMITS, GRID)
        accepted = True
    except ImageRejected:
        accepted = False
    # the safety property: the fast path never passes on a frame a full decode refuses (shaping may be
    # stricter than Pillow: see the stray-marker test below)
    if accepted:
        assert _full_decode_succeeds(data, (1088, 608))


def test_a_stray_marker_where_a_segment_belongs_is_refused_although_pillow_decodes_it() -> None:
    # found by the property above: APP0's marker turned into RST0 (FF D0), which Pillow skips over
    damaged = bytearray(ON_GRID)
    damaged[3] = 0xD0
    assert _full_decode_succeeds(bytes(damaged), (1088, 608))
    with pytest.raises(ImageRejected):
        shape_image(bytes(damaged), LIMITS, GRID)


def test_an_on_grid_jpeg_cut_short_is_refused_rather_than_passed_through() -> None:
    for keep in (0.3, 0.6, 0.95):
        with pytest.raises(ImageDecodeFailed, match="truncated"):
            shape_image(ON_GRID[: int(len(ON_GRID) * keep)], LIMITS, GRID)


def test_an_on_grid_jpeg_with_a_zip_appended_passes_through_without_a_byte_of_it() -> None:
    data = ON_GRID
    polyglot = data + b"PK\x03\x04" + bytes(range(256)) * 4
    shaped = shape_image(polyglot, LIMITS, GRID)
    assert shaped.passthrough
    assert b"PK\x03\x04" not in shaped.data
    assert shaped.data.endswith(b"\xff\xd9")
    assert len(shaped.data) <= len(data)


def test_an_on_grid_png_bomb_header_is_refused_before_any_decode() -> None:
    ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
    with pytest.raises(ImageDimensionsTooLarge):
        shape_image(header + b"\x00" * 16, LIMITS, GRID)


@pytest.mark.parametrize("size", [(1088, 608), (1280, 720)], ids=["passthrough", "resized"])
def test_a_frame_shaped_without_its_identity_is_the_same_frame_without_a_phash(size: tuple[int, int]) -> None:
    data = make_keyframe("allow", *size, seed=4)
    full = shape_image(data, LIMITS, GRID)
    bare = shape_image(data, LIMITS, GRID, identity=False)
    assert (bare.phash, bare.thumbnail) == (None, None)
    assert full.phash is not None
    assert full.thumbnail is not None
    assert (bare.data, bare.sha256, bare.passthrough, bare.decoded_size) == (
        full.data, full.sha256, full.passthrough, full.decoded_size)


def test_a_frame_shaped_without_its_identity_is_still_decoded_to_its_last_bit() -> None:
    # the identity is what the 1/8-scale decode feeds, not why it runs: a cut-short frame is refused alike
    with pytest.raises(ImageDecodeFailed, match="truncated"):
        shape_image(ON_GRID[: int(len(ON_GRID) * 0.95)], LIMITS, GRID, identity=False)
