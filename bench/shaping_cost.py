"""What shaping a keyframe costs next to decoding it, and next to the floor: CPU ms per frame, one core.

For generated photo-like JPEGs (q90: smooth gradients, sensor noise and shapes, sized like the frames in
the shaping-cost table of docs/performance.md) it measures, interleaved round by round so machine noise
hits every step alike, the CPU time of the calling thread (OpenCV held to one thread) of:

- decode only: Pillow open + full decode to RGB;
- the resize candidates to the ``smart_resize`` target (Pillow bicubic/bilinear, Pillow's own reducer: a box
  ``reduce`` then bilinear, or ``reducing_gap``; OpenCV nearest/linear/cubic/area, alone or after the box
  reduce, the bilinear one being what shaping uses), each with its PSNR against the reference, Pillow's
  antialiased bicubic (what Qwen's processor does). A resize is *acceptable* when it differs from the
  reference by less than the reference's own JPEG q90 round trip does: the engine could not tell;
- encode: Pillow JPEG q90, 4:2:0, baseline;
- the floor: decode + the fastest acceptable resize + encode, printed beside each size;
- naive: decode + Pillow bicubic + encode, one pass, as a first implementation would;
- shape_image: the gateway's shaping at the default budget (limits, draft decoding, resize, encode, hashes);

then shape_image ÷ decode and shape_image ÷ floor. Extra rows show the fast paths: a frame twice the target
(DCT-domain half-scale decode, no resize) and a frame already on the grid (passthrough: a 1/8-scale decode
for the safety check and the identity). Then the cost of leaving the resize to the engine's processor, and
how far the 8×-reduced identity lands from the full-frame one over varied keyframes.

    .venv/bin/python -m bench.shaping_cost              # about a minute
    .venv/bin/python -m bench.shaping_cost --rounds 40  # quicker, rougher
"""

from __future__ import annotations

import argparse
import functools
import gc
import io
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cv2
import imagehash
import numpy as np
import PIL
from PIL import Image, ImageDraw, features

from deploy.keyframes import LABELS, make_keyframe
from shaping.image import (
    IDENTITY_SCALE,
    THUMBNAIL_SIZE,
    ImageLimits,
    frame_identity,
    shape_image,
)
from shaping.image.pixels import resize as shaping_resize
from shaping.tokens import TokenGrid, smart_resize


def photo_jpeg(width: int, height: int, noise: float, seed: int = 0) -> bytes:
    """A q90 JPEG that compresses like a photo: gradients, noise for texture, shapes for edges."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    red = 128 + 90 * np.sin(x / width * 3.1 + 0.5) * np.cos(y / height * 2.3)
    green = 120 + 80 * np.cos(x / width * 1.7 - y / height * 2.9)
    blue = 110 + 70 * np.sin((x + y) / (width + height) * 5.0 + 1.0)
    pixels = np.stack([red, green, blue], axis=-1) + rng.normal(0, noise, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(40):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        side = int(rng.integers(width // 40, width // 6))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x0 + side, y0 + side * 2 // 3), fill=colour)
        else:
            draw.rectangle((x0, y0, x0 + side, y0 + side // 2), outline=colour, width=3)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def decode_only(data: bytes) -> Image.Image:
    """Pillow's full decode."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def decode_eighth(data: bytes) -> Image.Image:
    """Pillow's decode at 1/8 scale (DCT DC terms only): what a passthrough frame costs to check."""
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (image.width // 8, image.height // 8))
    image.load()
    return image


def encode(image: Image.Image) -> bytes:
    """The shaping step's encoder settings."""
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, subsampling="4:2:0", optimize=False, progressive=False)
    return buffer.getvalue()


def naive(data: bytes, target: tuple[int, int]) -> bytes:
    """Decode, Pillow bicubic, encode."""
    return encode(decode_only(data).convert("RGB").resize(target, Image.Resampling.BICUBIC))


Resize = Callable[[Image.Image, tuple[int, int]], Image.Image]


def _cv2(interpolation: int) -> Resize:
    def resize(image: Image.Image, size: tuple[int, int]) -> Image.Image:
        return Image.fromarray(cv2.resize(np.asarray(image), size, interpolation=interpolation))

    return resize


def _reduced(then: Resize) -> Resize:
    """A box ``reduce`` by the integer part of the downscale, then ``then`` for the rest (at most 2×)."""

    def resize(image: Image.Image, size: tuple[int, int]) -> Image.Image:
        factors = (max(1, image.width // size[0]), max(1, image.height // size[1]))
        reduced = image.reduce(factors) if factors != (1, 1) else image
        return reduced if reduced.size == size else then(reduced, size)

    return resize


RESIZES: dict[str, Resize] = {
    "Pillow bicubic": lambda image, size: image.resize(size, Image.Resampling.BICUBIC),
    "Pillow bicubic, reducing_gap 2": lambda image, size: image.resize(
        size, Image.Resampling.BICUBIC, reducing_gap=2.0
    ),
    "Pillow bilinear": lambda image, size: image.resize(size, Image.Resampling.BILINEAR),
    "OpenCV nearest": _cv2(cv2.INTER_NEAREST),
    "OpenCV linear": _cv2(cv2.INTER_LINEAR),
    "OpenCV cubic": _cv2(cv2.INTER_CUBIC),
    "OpenCV area": _cv2(cv2.INTER_AREA),
    "box reduce + OpenCV linear": _reduced(_cv2(cv2.INTER_LINEAR)),
    "box reduce + Pillow bilinear": _reduced(
        lambda image, size: image.resize(size, Image.Resampling.BILINEAR)),
    "shaping: Pillow bilinear, reducing_gap 2": shaping_resize,
}


def psnr(first: Image.Image, second: Image.Image) -> float:
    """Peak signal-to-noise ratio of two RGB images of one size, in dB."""
    error = np.mean((np.asarray(first, np.float64) - np.asarray(second, np.float64)) ** 2)
    return float("inf") if error == 0 else float(10 * np.log10(255**2 / error))


@dataclass(frozen=True)
class Frame:
    name: str
    data: bytes
    width: int
    height: int


def measure(steps: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """CPU milliseconds of the calling thread per call of each step, interleaved round by round (order
    rotated each round). CPU time, not wall time: another process's burst on a shared machine does not land
    in it, and everything measured here runs on the calling thread.
    """
    for step in steps.values():  # warm-up: imports, plugin registration, scipy for the phash
        for _ in range(3):
            step()
    names = list(steps)
    timings: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.thread_time_ns()
                steps[name]()
                timings[name].append((time.thread_time_ns() - started) / 1e6)
    finally:
        gc.enable()
    return timings


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


def off_grid(frame: Frame, limits: ImageLimits, grid: TokenGrid, rounds: int) -> dict[str, Any]:
    """Decode, every resize candidate, encode, the floor, naive and shape_image for one off-grid frame."""
    target = smart_resize(frame.width, frame.height, grid)
    decoded = decode_only(frame.data).convert("RGB")
    reference = decoded.resize(target, Image.Resampling.BICUBIC)
    with Image.open(io.BytesIO(encode(reference))) as round_trip:
        threshold = psnr(round_trip.convert("RGB"), reference)
    quality = {name: psnr(resize(decoded, target), reference) for name, resize in RESIZES.items()}
    steps: dict[str, Callable[[], object]] = {
        "decode only": functools.partial(decode_only, frame.data),
        **{f"resize: {name}": functools.partial(resize, decoded, target) for name, resize in RESIZES.items()},
        "encode q90": functools.partial(encode, reference),
        "naive": functools.partial(naive, frame.data, target),
        "shape_image": functools.partial(shape_image, frame.data, limits, grid),
    }
    timings = {name: statistics.median(values) for name, values in measure(steps, rounds).items()}
    # the floor is built from library primitives only, never from shaping's own resize
    acceptable = [name for name in RESIZES if quality[name] >= threshold and not name.startswith("shaping")]
    fastest = min(acceptable, key=lambda name: timings[f"resize: {name}"])
    floor = timings["decode only"] + timings[f"resize: {fastest}"] + timings["encode q90"]
    return {
        "target": target,
        "threshold_db": threshold,
        "quality_db": quality,
        "median_ms": timings,
        "floor_resize": fastest,
        "floor_ms": floor,
        "shaped": shape_image(frame.data, limits, grid),
    }


def fast_path(frame: Frame, limits: ImageLimits, grid: TokenGrid, rounds: int) -> dict[str, Any]:
    """Decode only, the 1/8-scale decode and shape_image for a frame a fast path applies to."""
    steps: dict[str, Callable[[], object]] = {
        "decode only": functools.partial(decode_only, frame.data),
        "decode at 1/8": functools.partial(decode_eighth, frame.data),
        "shape_image": functools.partial(shape_image, frame.data, limits, grid),
    }
    timings = {name: statistics.median(values) for name, values in measure(steps, rounds).items()}
    return {"median_ms": timings, "shaped": shape_image(frame.data, limits, grid)}


def engine_side_resize(frame: Frame, limits: ImageLimits, grid: TokenGrid, rounds: int) -> dict[str, Any]:
    """What leaving the resize to the engine's processor would cost (vLLM's ``mm_processor_kwargs`` with a
    per-request ``max_pixels``): the gateway still checks the frame and makes its identity (a 1/8-scale
    decode), then the engine's Hugging Face processor decodes it in full and resizes it with Pillow bicubic.
    """
    target = smart_resize(frame.width, frame.height, grid)

    def gateway_part() -> object:
        return frame_identity(decode_eighth(frame.data))

    def engine_part() -> object:
        return decode_only(frame.data).convert("RGB").resize(target, Image.Resampling.BICUBIC)

    steps: dict[str, Callable[[], object]] = {
        "gateway: 1/8 decode + identity": gateway_part,
        "engine: decode + Pillow bicubic": engine_part,
        "shape_image here": functools.partial(shape_image, frame.data, limits, grid),
    }
    timings = {name: statistics.median(values) for name, values in measure(steps, rounds).items()}
    shaped = shape_image(frame.data, limits, grid)
    return {"median_ms": timings, "sent_bytes": len(frame.data), "shaped_bytes": len(shaped.data)}


def identity_spread(
    frames: int, limits: ImageLimits, grid: TokenGrid, seed: int = 1
) -> dict[str, Counter[int]]:
    """Over varied keyframes (labels, sizes, seeds, JPEG qualities): how many pHash bits and thumbnail
    levels the 8×-reduced identity lies from the same identity computed on the full shaped frame.
    """
    rng = random.Random(seed)
    sizes = [(1280, 720), (1920, 1080), (1088, 608), (2176, 1216), (1056, 640), (720, 1280), (1000, 1000),
             (640, 360), (800, 600)]
    bits: Counter[int] = Counter()
    levels: Counter[int] = Counter()
    for _ in range(frames):
        width, height = rng.choice(sizes)
        data = make_keyframe(rng.choice(LABELS), width, height, seed=rng.randrange(10**6),
                             quality=rng.choice([50, 70, 85, 90, 95]))
        shaped = shape_image(data, limits, grid)
        assert shaped.phash is not None  # shaped with its identity
        assert shaped.thumbnail is not None
        with Image.open(io.BytesIO(shaped.data)) as image:
            full = image.convert("RGB")
        bits[int(imagehash.phash(full) - imagehash.hex_to_hash(shaped.phash))] += 1
        cells = np.asarray(full.resize(THUMBNAIL_SIZE, Image.Resampling.BOX), dtype=np.int16).reshape(-1)
        levels[int(np.abs(cells - np.frombuffer(shaped.thumbnail, np.uint8).astype(np.int16)).max())] += 1
    return {"phash_bits": bits, "thumbnail_levels": levels}


def _spread(counts: Counter[int]) -> str:
    values = sorted(counts.elements())
    shown = ", ".join(f"{value}: {count}" for value, count in sorted(counts.items()))
    return f"median {statistics.median(values):g}, max {values[-1]} ({shown})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the tables; answers the figures (for tests)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="timed calls per step (default 100)")
    parser.add_argument("--identity-frames", type=int, default=100,
                        help="varied keyframes for the identity spread (default 100; 0 skips it)")
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)  # one core, as every other step

    limits, grid = ImageLimits(), TokenGrid()
    frames = [
        Frame("1280×720", photo_jpeg(1280, 720, noise=3.0), 1280, 720),
        Frame("1920×1080", photo_jpeg(1920, 1080, noise=3.7), 1920, 1080),
    ]
    extras = [
        Frame("2176×1216 (2× target: DCT half-scale)", photo_jpeg(2176, 1216, noise=3.0), 2176, 1216),
        Frame("1088×608 (on the grid: passthrough)", photo_jpeg(1088, 608, noise=3.0), 1088, 608),
    ]
    load = os.getloadavg()
    print(
        f"Pillow {PIL.__version__}, libjpeg-turbo {features.version('libjpeg_turbo')}, OpenCV "
        f"{cv2.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs (load average "
        f"{load[0]:.1f}), CPU time of one thread; grid {grid.pixels_per_token}px, budget {grid.token_budget} "
        f"tokens; {args.rounds} rounds, medians"
    )
    report: dict[str, Any] = {"off_grid": {}, "fast_path": {}}
    for frame in frames:
        result = off_grid(frame, limits, grid, args.rounds)
        report["off_grid"][frame.name] = result
        ms, shaped = result["median_ms"], result["shaped"]
        print(f"\n{frame.name}, {len(frame.data) / 1024:.0f} KiB → {shaped.width}×{shaped.height}: "
              f"a resize is acceptable at PSNR ≥ {result['threshold_db']:.1f} dB against Pillow bicubic "
              "(its own q90 round trip)")
        print(f"  {'step':<44} {'CPU ms':>7} {'PSNR dB':>8}")
        print(f"  {'decode only':<44} {ms['decode only']:>7.2f}")
        for name in RESIZES:
            mark = "" if result["quality_db"][name] >= result["threshold_db"] else "  (not acceptable)"
            print(f"  {'resize: ' + name:<44} {ms['resize: ' + name]:>7.2f} "
                  f"{result['quality_db'][name]:>8.1f}{mark}")
        print(f"  {'encode q90':<44} {ms['encode q90']:>7.2f}")
        print(f"  {'floor: decode + ' + result['floor_resize'] + ' + encode':<44} {result['floor_ms']:>7.2f}")
        print(f"  {'naive: decode + Pillow bicubic + encode':<44} {ms['naive']:>7.2f}")
        print(f"  {'shape_image':<44} {ms['shape_image']:>7.2f}")
        print(f"  shape_image / floor = {ms['shape_image'] / result['floor_ms']:.2f}×, "
              f"shape_image / decode only = {ms['shape_image'] / ms['decode only']:.2f}× "
              f"(naive {ms['naive'] / ms['decode only']:.2f}×)")
    for frame in extras:
        result = fast_path(frame, limits, grid, args.rounds)
        report["fast_path"][frame.name] = result
        ms, shaped = result["median_ms"], result["shaped"]
        print(f"\n{frame.name}, {len(frame.data) / 1024:.0f} KiB → {shaped.width}×{shaped.height}, "
              f"decoded at {shaped.decoded_size[0]}×{shaped.decoded_size[1]}"
              f"{', passthrough' if shaped.passthrough else ''}")
        for name, value in ms.items():
            print(f"  {name:<44} {value:>7.2f}")
        print(f"  shape_image / decode only = {ms['shape_image'] / ms['decode only']:.2f}×")
    engine = engine_side_resize(frames[0], limits, grid, args.rounds)
    report["engine_side_resize"] = engine
    ms = engine["median_ms"]
    print(f"\nleaving the resize to the engine ({frames[0].name}): the gateway sends "
          f"{engine['sent_bytes'] / 1024:.0f} KiB instead of {engine['shaped_bytes'] / 1024:.0f} KiB")
    for name, value in ms.items():
        print(f"  {name:<44} {value:>7.2f}")
    both = ms["gateway: 1/8 decode + identity"] + ms["engine: decode + Pillow bicubic"]
    print(f"  gateway + engine = {both:.2f} CPU ms against {ms['shape_image here']:.2f} shaped here")
    if args.identity_frames:
        spread = identity_spread(args.identity_frames, limits, grid)
        report["identity"] = spread
        print(f"\nidentity from the frame reduced {IDENTITY_SCALE}× against the full frame, "
              f"{args.identity_frames} varied keyframes:")
        print(f"  pHash bits apart:           {_spread(spread['phash_bits'])}")
        print(f"  thumbnail levels apart, max cell: {_spread(spread['thumbnail_levels'])}")
    return report


if __name__ == "__main__":
    main()
