"""Keyframe shaping: safe decoding, limits, conversions, the token grid and deterministic JPEG output.

Every image here is generated with Pillow, numpy or by hand (struct and zlib), never read from disk.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import imagehash
import numpy as np
import pytest
from PIL import Image, ImageCms, ImageDraw, ImageFile, ImageOps, JpegImagePlugin

from shaping.errors import (
    AnimatedImage,
    EmptyImage,
    ImageAspectRatioTooLarge,
    ImageDecodeFailed,
    ImageDimensionsTooLarge,
    ImageRejected,
    ImageTooLarge,
    InvalidDataUrl,
    UnsupportedImageFormat,
)
from shaping.image import ImageLimits, ShapedImage, decode_data_url, shape_image
from shaping.tokens import TokenGrid, image_tokens, smart_resize

LIMITS = ImageLimits()
GRID = TokenGrid()
RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


# --- test images ----------------------------------------------------------------------------------------


def encode(image: Image.Image, image_format: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **params)
    return buffer.getvalue()


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth gradients, sensor noise and shapes: compresses like a photo, not like a flat test card."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    red = 128 + 90 * np.sin(x / width * 3.1 + 0.5) * np.cos(y / height * 2.3)
    green = 120 + 80 * np.cos(x / width * 1.7 - y / height * 2.9)
    blue = 110 + 70 * np.sin((x + y) / (width + height) * 5.0 + 1.0)
    pixels = np.stack([red, green, blue], axis=-1) + rng.normal(0, 3, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(30):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        side = int(rng.integers(max(2, width // 40), max(3, width // 6)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        draw.ellipse((x0, y0, x0 + side, y0 + side * 2 // 3), fill=colour)
    return image


@functools.cache
def photo_jpeg(width: int, height: int, seed: int = 0) -> bytes:
    return encode(photo(width, height, seed), "JPEG", quality=90)


def halves(size: tuple[int, int], left: tuple[int, ...], right: tuple[int, ...], mode: str) -> Image.Image:
    """An image whose left half is one colour and right half another."""
    image = Image.new(mode, size, left)
    image.paste(right, (size[0] // 2, 0, size[0], size[1]))
    return image


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG of a few dozen bytes whose IHDR claims ``width``×``height`` RGB pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real small JPEG with its frame header rewritten to claim ``width``×``height``."""
    data = bytearray(encode(photo(64, 48), "JPEG"))
    frame = data.index(b"\xff\xc0")
    data[frame + 5 : frame + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def webp_canvas_claiming(width: int, height: int) -> bytes:
    """A WebP whose VP8X header claims a ``width``×``height`` canvas (Pillow would allocate it on open)."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00" * 4
    vp8x += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x


def oriented_jpeg(image: Image.Image, orientation: int, **params: object) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, "JPEG", exif=exif.tobytes(), quality=95, **params)


def decoded(shaped: ShapedImage) -> Image.Image:
    with Image.open(io.BytesIO(shaped.data)) as image:
        image.load()
        return image.copy()


def pixel(shaped: ShapedImage, x: float, y: float) -> tuple[int, ...]:
    """The colour at a fraction of the shaped image's width and height."""
    image = decoded(shaped)
    value = image.getpixel((int(x * (image.width - 1)), int(y * (image.height - 1))))
    assert isinstance(value, tuple)
    return value


def close_to(actual: tuple[int, ...], expected: tuple[int, ...], tolerance: int = 12) -> bool:
    return all(abs(a - e) <= tolerance for a, e in zip(actual, expected, strict=True))


def mean_difference(first: Image.Image, second: Image.Image) -> float:
    return float(np.abs(np.asarray(first, np.int16) - np.asarray(second, np.int16)).mean())


# --- the grid and the output ----------------------------------------------------------------------------


def test_a_720p_photo_is_shaped_to_1088_by_608_and_646_tokens() -> None:
    data = photo_jpeg(1280, 720)
    shaped = shape_image(data, LIMITS, GRID)
    assert (shaped.width, shaped.height, shaped.image_tokens) == (1088, 608, 646)
    assert (shaped.source_width, shaped.source_height, shaped.source_format) == (1280, 720, "JPEG")
    assert decoded(shaped).size == (1088, 608)
    assert shaped.mime == "image/jpeg"
    assert not shaped.passthrough


def test_a_1080p_photo_is_shaped_to_the_same_grid() -> None:
    shaped = shape_image(photo_jpeg(1920, 1080), LIMITS, GRID)
    assert (shaped.width, shaped.height, shaped.image_tokens) == (1088, 608, 646)
    assert decoded(shaped).size == (1088, 608)


def test_the_shaped_pixels_look_like_a_bicubic_resize_of_the_source() -> None:
    source = photo(1920, 1080)
    shaped = shape_image(encode(source, "JPEG", quality=95), LIMITS, GRID)
    reference = source.resize((1088, 608), Image.Resampling.BICUBIC)
    assert mean_difference(decoded(shaped), reference) < 3


def test_a_frame_twice_the_target_is_scaled_in_the_dct_domain_without_visible_loss() -> None:
    source = photo(2176, 1216)
    shaped = shape_image(encode(source, "JPEG", quality=95), LIMITS, GRID)
    assert decoded(shaped).size == (1088, 608)
    assert mean_difference(decoded(shaped), source.resize((1088, 608), Image.Resampling.BICUBIC)) < 4


def test_a_frame_twice_the_target_is_decoded_at_half_scale_with_no_resize_after() -> None:
    data = encode(photo(2176, 1216), "JPEG", quality=95)
    with Image.open(io.BytesIO(data)) as half_scale:
        half_scale.draft("RGB", (1088, 608))
        half_scale.load()
        assert half_scale.size == (1088, 608)
        expected = encode(half_scale, "JPEG", quality=90, subsampling="4:2:0")
    assert shape_image(data, LIMITS, GRID).data == expected


@pytest.mark.parametrize(
    ("size", "grid"), [((640, 480), GRID), ((3000, 2000), GRID), ((1280, 720), TokenGrid.qwen2_5_vl())]
)
def test_the_token_count_is_what_the_engine_will_count(size: tuple[int, int], grid: TokenGrid) -> None:
    shaped = shape_image(encode(photo(*size), "PNG"), LIMITS, grid)
    assert (shaped.width, shaped.height) == smart_resize(*size, grid)
    assert shaped.image_tokens == image_tokens(*size, grid)
    engine = TokenGrid(
        pixels_per_token=grid.pixels_per_token,
        min_pixels=grid.min_pixels,
        max_pixels=grid.max_pixels,
        token_budget=None,
    )
    assert smart_resize(shaped.width, shaped.height, engine) == (shaped.width, shaped.height)


def test_a_small_image_is_scaled_up_to_the_engine_minimum() -> None:
    shaped = shape_image(encode(Image.new("RGB", (64, 64), BLUE), "PNG"), LIMITS, GRID)
    assert (shaped.width, shaped.height, shaped.image_tokens) == (256, 256, 64)


def test_the_same_input_gives_byte_identical_output() -> None:
    data = photo_jpeg(1280, 720)
    first, second = shape_image(data, LIMITS, GRID), shape_image(data, LIMITS, GRID)
    assert first.data == second.data
    assert (first.sha256, first.phash) == (second.sha256, second.phash)


def test_shaping_in_a_thread_pool_gives_the_same_bytes_as_shaping_in_turn() -> None:
    frames = [photo_jpeg(1280, 720, seed) for seed in range(4)] * 2
    in_turn = [shape_image(frame, LIMITS, GRID).sha256 for frame in frames]
    with ThreadPoolExecutor(max_workers=4) as pool:
        pooled = list(pool.map(lambda frame: shape_image(frame, LIMITS, GRID).sha256, frames))
    assert pooled == in_turn


def test_the_identities_describe_the_shaped_bytes() -> None:
    shaped = shape_image(photo_jpeg(1280, 720), LIMITS, GRID)
    assert shaped.sha256 == hashlib.sha256(shaped.data).hexdigest()
    assert len(shaped.phash) == 16
    assert int(shaped.phash, 16) >= 0
    assert imagehash.hex_to_hash(shaped.phash) - imagehash.phash(decoded(shaped)) <= 4


def test_the_data_url_carries_the_shaped_bytes() -> None:
    shaped = shape_image(photo_jpeg(1280, 720), LIMITS, GRID)
    assert shaped.data_url.startswith("data:image/jpeg;base64,")
    assert decode_data_url(shaped.data_url, LIMITS.max_bytes) == ("image/jpeg", shaped.data)


def test_the_repr_leaves_out_the_bytes() -> None:
    assert "data=" not in repr(shape_image(photo_jpeg(1280, 720), LIMITS, GRID))


def test_the_output_is_a_baseline_4_2_0_jpeg_at_the_requested_quality() -> None:
    data = photo_jpeg(1280, 720)
    low, high = (shape_image(data, LIMITS, GRID, jpeg_quality=q) for q in (60, 95))
    with Image.open(io.BytesIO(high.data)) as opened:
        assert isinstance(opened, JpegImagePlugin.JpegImageFile)
        assert "progressive" not in opened.info
        assert JpegImagePlugin.get_sampling(opened) == 2  # 4:2:0
    assert len(low.data) < len(high.data)


def test_no_metadata_reaches_the_engine() -> None:
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    exif = Image.Exif()
    exif[0x010F] = "SecretCam"  # Make
    source = photo(1280, 720)
    data = encode(
        source, "JPEG", exif=exif.tobytes(), icc_profile=icc, comment=b"hello engine", xmp=b"<x:xmpmeta/>"
    )
    shaped = shape_image(data, LIMITS, GRID)
    for marker in (b"Exif", b"SecretCam", b"ICC_PROFILE", b"hello engine", b"xmpmeta"):
        assert marker not in shaped.data
    with Image.open(io.BytesIO(shaped.data)) as opened:
        assert not {"exif", "icc_profile", "comment", "xmp"} & set(opened.info)


def test_a_quality_outside_1_to_100_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="jpeg_quality"):
        shape_image(photo_jpeg(1280, 720), LIMITS, GRID, jpeg_quality=0)


# --- passthrough ----------------------------------------------------------------------------------------


def test_a_baseline_jpeg_already_on_the_grid_passes_through_unchanged() -> None:
    data = photo_jpeg(1088, 608)
    shaped = shape_image(data, LIMITS, GRID)
    assert shaped.passthrough
    assert shaped.data == data
    assert (shaped.width, shaped.height, shaped.image_tokens) == (1088, 608, 646)


def test_a_passed_through_jpeg_loses_its_metadata_but_not_a_pixel() -> None:
    source = photo(1088, 608)
    data = encode(source, "JPEG", quality=90, exif=Image.Exif().tobytes(), comment=b"from the camera")
    shaped = shape_image(data, LIMITS, GRID)
    assert shaped.passthrough
    assert b"from the camera" not in shaped.data
    assert b"Exif" not in shaped.data
    with Image.open(io.BytesIO(data)) as original:
        assert np.array_equal(np.asarray(decoded(shaped)), np.asarray(original.convert("RGB")))


def test_a_frame_passed_through_unchanged_reuses_the_callers_base64_for_the_engine() -> None:
    data = photo_jpeg(1088, 608)
    text = base64.b64encode(data).decode()
    shaped = shape_image(data, LIMITS, GRID).reusing_encoding(data, text)
    assert shaped.encoded is text  # the caller's string itself, not an encoding of it again
    assert shaped.data_url == "data:image/jpeg;base64," + text


@pytest.mark.parametrize(
    "why", ["spare bits set in the last character", "metadata dropped", "resized", "other bytes"]
)
def test_the_callers_base64_is_kept_only_where_it_is_what_encoding_the_shaped_bytes_writes(why: str) -> None:
    data = photo_jpeg(1088, 608)
    if why == "metadata dropped":
        data = encode(photo(1088, 608), "JPEG", quality=90, comment=b"from the camera")
    elif why == "resized":
        data = photo_jpeg(1280, 720)
    text = base64.b64encode(data).decode()
    source = data
    if why == "spare bits set in the last character":
        while len(data) % 3 == 0:  # a length with a padded last quartet, so its last character has spare bits
            data = encode(photo(1088, 608, seed=len(data)), "JPEG", quality=90)
        source, text = data, base64.b64encode(data).decode()
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        last = text.rstrip("=")
        spare = alphabet[alphabet.index(last[-1]) | 1]  # the lowest bit is spare with one or two bytes left
        text = last[:-1] + spare + text[len(last):]
        assert base64.b64decode(text) == data  # the same bytes, strictly, in a text encoding would not write
    elif why == "other bytes":
        source = photo_jpeg(1088, 608, seed=1)
        text = base64.b64encode(source).decode()
    shaped = shape_image(data, LIMITS, GRID)
    reused = shaped.reusing_encoding(source, text)
    assert reused.encoded is None
    assert reused.data_url == "data:image/jpeg;base64," + base64.b64encode(shaped.data).decode()


def test_a_progressive_jpeg_on_the_grid_is_re_encoded_as_baseline() -> None:
    shaped = shape_image(encode(photo(1088, 608), "JPEG", progressive=True), LIMITS, GRID)
    assert not shaped.passthrough
    with Image.open(io.BytesIO(shaped.data)) as opened:
        assert "progressive" not in opened.info


def test_a_rotated_jpeg_on_the_grid_is_re_encoded_upright() -> None:
    shaped = shape_image(oriented_jpeg(photo(1088, 608), 6), LIMITS, GRID)
    assert not shaped.passthrough
    assert (shaped.width, shaped.height) == (608, 1088)


def test_a_truncated_jpeg_on_the_grid_is_refused_rather_than_passed_through() -> None:
    data = photo_jpeg(1088, 608)
    with pytest.raises(ImageDecodeFailed):
        shape_image(data[: len(data) * 2 // 3], LIMITS, GRID)


# --- orientation ----------------------------------------------------------------------------------------


def test_an_exif_rotated_jpeg_comes_out_upright() -> None:
    stored = Image.new("RGB", (640, 360), BLUE)
    stored.paste(RED, (0, 0, 160, 90))  # top-left as stored
    data = oriented_jpeg(stored, 6)
    shaped = shape_image(data, LIMITS, GRID)
    assert (shaped.width, shaped.height) == smart_resize(360, 640, GRID) == (352, 640)
    assert (shaped.source_width, shaped.source_height) == (360, 640)
    # Orientation 6 turns the stored top-left to the top-right, as ImageOps.exif_transpose shows it.
    with Image.open(io.BytesIO(data)) as original:
        upright = ImageOps.exif_transpose(original)
    assert close_to(upright.getpixel((upright.width - 10, 10)), RED)  # type: ignore[arg-type]  # an RGB pixel: a tuple
    assert close_to(pixel(shaped, 0.97, 0.02), RED)
    assert close_to(pixel(shaped, 0.03, 0.02), BLUE)


def test_a_jpeg_with_corrupt_exif_is_shaped_as_stored() -> None:
    data = encode(halves((640, 360), RED, BLUE, "RGB"), "JPEG", exif=b"Exif\x00\x00not a tiff header")
    shaped = shape_image(data, LIMITS, GRID)
    assert (shaped.width, shaped.height) == smart_resize(640, 360, GRID)
    assert close_to(pixel(shaped, 0.1, 0.5), RED)


# Pillow itself warns about this EXIF block when it opens the file; the shaping does not depend on it.
@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")
def test_a_jpeg_whose_exif_directory_is_cut_short_is_shaped_as_stored() -> None:
    truncated_directory = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x05\x01\x12"
    data = encode(halves((640, 360), RED, BLUE, "RGB"), "JPEG", exif=truncated_directory)
    shaped = shape_image(data, LIMITS, GRID)
    assert (shaped.width, shaped.height) == smart_resize(640, 360, GRID)


# --- polyglots ------------------------------------------------------------------------------------------


def zip_archive() -> bytes:
    return (
        b"PK\x03\x04"
        + b"\x14\x00"
        + b"\x00" * 20
        + b"evil.sh"
        + b"#!/bin/sh\nrm -rf /\n"
        + b"PK\x05\x06"
        + b"\x00" * 18
    )


def test_a_jpeg_with_a_zip_appended_is_shaped_from_its_pixels_only() -> None:
    shaped = shape_image(photo_jpeg(1280, 720) + zip_archive(), LIMITS, GRID)
    assert b"PK\x03\x04" not in shaped.data
    assert b"evil.sh" not in shaped.data


def test_an_on_grid_jpeg_with_html_appended_passes_through_without_it() -> None:
    data = photo_jpeg(1088, 608)
    shaped = shape_image(data + b"<html><script>alert(1)</script></html>", LIMITS, GRID)
    assert shaped.passthrough
    assert shaped.data == data


def test_a_png_with_trailing_data_is_shaped_from_its_pixels_only() -> None:
    shaped = shape_image(encode(photo(640, 480), "PNG") + zip_archive(), LIMITS, GRID)
    assert b"evil.sh" not in shaped.data
    assert (shaped.width, shaped.height) == smart_resize(640, 480, GRID)


# --- refusals: bytes and formats --------------------------------------------------------------------------


def test_zero_bytes_are_refused_as_an_empty_image() -> None:
    with pytest.raises(EmptyImage) as caught:
        shape_image(b"", LIMITS, GRID)
    assert (caught.value.code, caught.value.status) == ("empty_image", 400)


def test_more_bytes_than_the_limit_are_refused_before_anything_else() -> None:
    with pytest.raises(ImageTooLarge) as caught:
        shape_image(b"\x00" * 2049, ImageLimits(max_bytes=2048), GRID)
    assert (caught.value.code, caught.value.status) == ("image_too_large", 413)
    assert "2,049 bytes" in caught.value.message


def test_bytes_that_are_no_image_format_are_refused_as_unsupported() -> None:
    with pytest.raises(UnsupportedImageFormat) as caught:
        shape_image(bytes(range(256)) * 4, LIMITS, GRID)
    assert (caught.value.code, caught.value.status) == ("unsupported_image_format", 415)
    assert "send JPEG, PNG or WebP" in caught.value.message


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: encode(Image.new("RGB", (32, 32), RED), "GIF"), "GIF"),
        (lambda: encode(Image.new("RGB", (32, 32), RED), "BMP"), "BMP"),
        (lambda: encode(Image.new("RGB", (32, 32), RED), "TIFF"), "TIFF"),
        (
            lambda: b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>',
            "SVG",
        ),
        (lambda: b"<!DOCTYPE html><html><body>hello</body></html>", "HTML"),
    ],
    ids=["gif", "bmp", "tiff", "svg", "html"],
)
def test_other_formats_are_refused_as_unsupported_media_by_name(
    make: Callable[[], bytes], named: str
) -> None:
    with pytest.raises(UnsupportedImageFormat) as caught:
        shape_image(make(), LIMITS, GRID)
    assert named in caught.value.message


def test_an_animated_gif_is_refused_as_unsupported_media() -> None:
    frames = [Image.new("RGB", (32, 32), colour) for colour in (RED, BLUE)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(UnsupportedImageFormat, match="GIF"):
        shape_image(data, ImageLimits(animated="first_frame"), GRID)


def test_a_format_left_out_of_the_allowlist_is_refused() -> None:
    with pytest.raises(UnsupportedImageFormat, match="PNG images are not accepted here; send JPEG"):
        shape_image(encode(photo(64, 64), "PNG"), ImageLimits(allowed_formats=frozenset({"JPEG"})), GRID)


# --- refusals: corrupt data -------------------------------------------------------------------------------


def test_a_truncated_jpeg_is_refused_as_corrupt() -> None:
    data = photo_jpeg(1280, 720)
    with pytest.raises(ImageDecodeFailed) as caught:
        shape_image(data[: len(data) // 2], LIMITS, GRID)
    assert (caught.value.code, caught.value.status) == ("image_decode_failed", 400)
    assert "truncated" in caught.value.message


def test_a_truncated_png_is_refused_as_corrupt() -> None:
    data = encode(photo(320, 240), "PNG")
    with pytest.raises(ImageDecodeFailed):
        shape_image(data[: len(data) // 2], LIMITS, GRID)


def test_a_jpeg_cut_inside_its_headers_is_refused_as_corrupt() -> None:
    with pytest.raises(ImageDecodeFailed):
        shape_image(photo_jpeg(1280, 720)[:100], LIMITS, GRID)


def test_a_png_whose_pixel_data_is_garbage_is_refused_as_corrupt() -> None:
    data = bytearray(encode(photo(64, 64), "PNG"))
    start = data.index(b"IDAT") + 4
    data[start : start + 200] = bytes(200)
    with pytest.raises(ImageDecodeFailed):
        shape_image(bytes(data), LIMITS, GRID)


def test_a_png_without_an_image_header_is_refused_as_corrupt() -> None:
    with pytest.raises(ImageDecodeFailed, match="IHDR"):
        shape_image(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IEND", b""), LIMITS, GRID)


def test_a_png_header_claiming_zero_pixels_is_refused_as_empty() -> None:
    with pytest.raises(EmptyImage, match="0×100"):
        shape_image(png_claiming(0, 100), LIMITS, GRID)


def test_loading_truncated_images_switched_on_process_wide_stops_shaping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        shape_image(photo_jpeg(1280, 720), LIMITS, GRID)


# --- refusals: dimensions, before decoding ----------------------------------------------------------------


def test_a_png_claiming_100000_by_100000_is_refused_from_its_header() -> None:
    data = png_claiming(100_000, 100_000)
    assert len(data) < 200  # refused unread: decoding would need 30 GB
    with pytest.raises(ImageDimensionsTooLarge) as caught:
        shape_image(data, LIMITS, GRID)
    assert (caught.value.code, caught.value.status) == ("image_dimensions_too_large", 413)
    assert caught.value.message == "PNG header says 100000×100000 pixels, over the 40,000,000 limit"


def test_a_png_claiming_50000_by_50000_says_so_in_plain_words() -> None:
    with pytest.raises(ImageDimensionsTooLarge) as caught:
        shape_image(png_claiming(50_000, 50_000), LIMITS, GRID)
    assert str(caught.value) == "PNG header says 50000×50000 pixels, over the 40,000,000 limit"


def test_a_jpeg_whose_frame_header_claims_huge_dimensions_is_refused_before_decoding() -> None:
    with pytest.raises(ImageDimensionsTooLarge, match="JPEG header says 30000×20000 pixels"):
        shape_image(jpeg_claiming(30_000, 20_000), LIMITS, GRID)


def test_a_webp_canvas_bomb_is_refused_before_pillow_allocates_it() -> None:
    with pytest.raises(ImageDimensionsTooLarge, match="WebP header says 16000×16000 pixels"):
        shape_image(webp_canvas_claiming(16_000, 16_000), LIMITS, GRID)


def test_a_side_longer_than_the_limit_is_refused() -> None:
    with pytest.raises(ImageDimensionsTooLarge, match="no side may be over 16,384 pixels"):
        shape_image(png_claiming(17_000, 100), LIMITS, GRID)


def test_the_pixel_limit_is_a_setting() -> None:
    with pytest.raises(ImageDimensionsTooLarge, match="over the 100,000 limit"):
        shape_image(encode(photo(400, 300), "PNG"), ImageLimits(max_pixels_decoded=100_000), GRID)


def test_an_image_longer_than_200_to_1_is_refused_as_the_model_would() -> None:
    with pytest.raises(ImageAspectRatioTooLarge) as caught:
        shape_image(encode(Image.new("RGB", (2010, 10), RED), "PNG"), LIMITS, GRID)
    assert caught.value.status == 422


def test_a_pixel_limit_above_pillows_own_bomb_threshold_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="decompression-bomb"):
        ImageLimits(max_pixels_decoded=200_000_000)


def test_an_unknown_format_in_the_allowlist_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="allowed_formats"):
        ImageLimits(allowed_formats=frozenset({"GIF"}))  # type: ignore[arg-type]  # not an allowed format, on purpose


# --- animation ------------------------------------------------------------------------------------------


def animated(image_format: str) -> bytes:
    frames = [Image.new("RGB", (320, 240), colour) for colour in (RED, BLUE, WHITE)]
    return encode(frames[0], image_format, save_all=True, append_images=frames[1:], duration=100)


@pytest.mark.parametrize("image_format", ["WEBP", "PNG"])
def test_an_animated_image_is_refused_by_default(image_format: str) -> None:
    with pytest.raises(AnimatedImage) as caught:
        shape_image(animated(image_format), LIMITS, GRID)
    assert (caught.value.code, caught.value.status) == ("animated_image", 422)
    assert "3 frames" in caught.value.message


@pytest.mark.parametrize("image_format", ["WEBP", "PNG"])
def test_an_animated_image_gives_its_first_frame_when_asked(image_format: str) -> None:
    shaped = shape_image(animated(image_format), ImageLimits(animated="first_frame"), GRID)
    assert close_to(pixel(shaped, 0.5, 0.5), RED)


# --- colour modes ---------------------------------------------------------------------------------------


def test_a_webp_keyframe_is_shaped_like_a_jpeg_one() -> None:
    shaped = shape_image(encode(photo(1280, 720), "WEBP", quality=90), LIMITS, GRID)
    assert (shaped.width, shaped.height, shaped.source_format) == (1088, 608, "WEBP")


def test_a_lossless_webp_with_alpha_is_composited_on_white() -> None:
    image = halves((320, 240), (0, 0, 0, 0), (*BLUE, 255), "RGBA")
    shaped = shape_image(encode(image, "WEBP", lossless=True), LIMITS, GRID)
    assert close_to(pixel(shaped, 0.1, 0.5), WHITE)
    assert close_to(pixel(shaped, 0.9, 0.5), BLUE)


def test_a_cmyk_jpeg_is_converted_to_rgb() -> None:
    shaped = shape_image(encode(Image.new("CMYK", (320, 240), (0, 255, 255, 0)), "JPEG"), LIMITS, GRID)
    assert decoded(shaped).mode == "RGB"
    assert close_to(pixel(shaped, 0.5, 0.5), RED, tolerance=20)


def test_a_greyscale_jpeg_comes_out_as_three_channel_rgb() -> None:
    shaped = shape_image(encode(Image.new("L", (320, 240), 100), "JPEG"), LIMITS, GRID)
    assert decoded(shaped).mode == "RGB"
    assert close_to(pixel(shaped, 0.5, 0.5), (100, 100, 100), tolerance=3)


def test_a_16_bit_greyscale_png_keeps_its_tones_instead_of_clipping_to_white() -> None:
    source = Image.fromarray(np.full((240, 320), 40_000, dtype=np.uint16))
    assert source.mode == "I;16"
    shaped = shape_image(encode(source, "PNG"), LIMITS, GRID)
    assert close_to(pixel(shaped, 0.5, 0.5), (156, 156, 156), tolerance=3)  # 40000 / 65535 of 255


def test_a_palette_png_with_a_transparent_index_is_composited_on_white() -> None:
    image = halves((320, 240), (0,), (1,), "P")
    image.putpalette([*RED, *BLUE])
    shaped = shape_image(encode(image, "PNG", transparency=0), LIMITS, GRID)
    assert close_to(pixel(shaped, 0.1, 0.5), WHITE)
    assert close_to(pixel(shaped, 0.9, 0.5), BLUE)


def test_an_rgba_png_is_composited_on_white() -> None:
    image = halves((320, 240), (0, 0, 0, 128), (0, 0, 0, 0), "RGBA")
    shaped = shape_image(encode(image, "PNG"), LIMITS, GRID)
    assert close_to(pixel(shaped, 0.1, 0.5), (127, 127, 127), tolerance=4)
    assert close_to(pixel(shaped, 0.9, 0.5), WHITE)


def test_a_greyscale_png_with_alpha_is_composited_on_white() -> None:
    image = halves((320, 240), (0, 255), (0, 0), "LA")
    shaped = shape_image(encode(image, "PNG"), LIMITS, GRID)
    assert close_to(pixel(shaped, 0.1, 0.5), (0, 0, 0))
    assert close_to(pixel(shaped, 0.9, 0.5), WHITE)


def test_an_rgb_png_with_a_transparent_colour_key_is_composited_on_white() -> None:
    image = halves((320, 240), RED, BLUE, "RGB")
    shaped = shape_image(encode(image, "PNG", transparency=RED), LIMITS, GRID)
    assert close_to(pixel(shaped, 0.1, 0.5), WHITE)
    assert close_to(pixel(shaped, 0.9, 0.5), BLUE)


# --- data URLs ------------------------------------------------------------------------------------------


def data_url(payload: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(payload).decode()}"


def test_a_data_url_gives_its_type_and_bytes() -> None:
    payload = encode(photo(32, 32), "PNG")
    assert decode_data_url(data_url(payload, "Image/PNG"), 1 << 20) == ("image/png", payload)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/frame.jpg",
        "file:///etc/passwd",
        "iVBORw0KGgo=",
        "data:image/png,rawbytes",
        "data:image/png;base64",
    ],
    ids=["https", "file", "bare-base64", "not-base64", "no-comma"],
)
def test_anything_but_a_base64_data_url_is_refused(url: str) -> None:
    with pytest.raises(InvalidDataUrl) as caught:
        decode_data_url(url, 1 << 20)
    assert (caught.value.code, caught.value.status) == ("invalid_data_url", 400)


def test_a_data_url_of_another_media_type_is_refused_as_unsupported() -> None:
    with pytest.raises(UnsupportedImageFormat, match="text/html"):
        decode_data_url(data_url(b"<html></html>", "text/html"), 1 << 20)


@pytest.mark.parametrize(
    "payload",
    ["iVBORw0KGgo", "iVBORw0KGgo==", "iVBO Rw0KGgo=", "iVBORw0KGgo=\n", "iVBO-w0KGgo=", "iVBORw0KGgo=AAAA"],
    ids=["missing-padding", "extra-padding", "space", "newline", "url-safe-alphabet", "data-after-padding"],
)
def test_base64_that_is_not_strictly_valid_is_refused(payload: str) -> None:
    with pytest.raises(InvalidDataUrl):
        decode_data_url(f"data:image/png;base64,{payload}", 1 << 20)


def test_a_data_url_over_the_limit_is_refused_before_it_is_decoded() -> None:
    # Not even valid base64: had it been decoded first, this would be an invalid_data_url.
    with pytest.raises(ImageTooLarge) as caught:
        decode_data_url("data:image/png;base64," + "!" * 4_000_000, 1 << 20)
    assert caught.value.status == 413


def test_a_data_url_just_over_the_limit_is_refused_after_decoding() -> None:
    with pytest.raises(ImageTooLarge):
        decode_data_url(data_url(b"\x00" * 1025), 1024)
    assert decode_data_url(data_url(b"\x00" * 1024), 1024)[1] == b"\x00" * 1024


def test_an_empty_data_url_is_refused_as_an_empty_image() -> None:
    with pytest.raises(EmptyImage):
        decode_data_url("data:image/png;base64,", 1024)


def test_every_refusal_is_an_image_rejected_with_a_code_and_a_status() -> None:
    refusals = [EmptyImage, ImageTooLarge, ImageDimensionsTooLarge, UnsupportedImageFormat, ImageDecodeFailed]
    refusals += [InvalidDataUrl, AnimatedImage, ImageAspectRatioTooLarge]
    for kind in refusals:
        assert issubclass(kind, ImageRejected)
        assert not issubclass(kind, ValueError)
        assert kind.code
        assert kind.status in (400, 413, 415, 422)
