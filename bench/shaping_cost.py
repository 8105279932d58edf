"""What shaping a keyframe costs next to decoding it: median and p99 milliseconds per frame, one core.

For generated photo-like JPEGs (q90: smooth gradients, sensor noise and shapes, sized like the frames in
docs/spark.md's "Image shaping cost" table) it measures, side by side and interleaved so machine noise hits
all of them alike:

- decode only: Pillow open + full decode to RGB;
- naive: decode + bicubic resize to the smart_resize target + JPEG q90 encode;
- shape_image: the gateway's shaping at the default budget (limits, draft decoding, resize, encode, hashes);

then the ratio shape_image / decode only. Extra rows show where the fast paths apply: a frame twice the
target (DCT-domain half-scale decode, no resize) and a frame already on the grid (passthrough).

    .venv/bin/python bench/shaping_cost.py            # about 30 s
    .venv/bin/python bench/shaping_cost.py --rounds 60 # quicker, rougher p99
"""

from __future__ import annotations

import argparse
import functools
import gc
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import PIL
from PIL import Image, ImageDraw, features

from shaping.image import ImageLimits, shape_image
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
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def naive(data: bytes, target: tuple[int, int]) -> bytes:
    resized = decode_only(data).convert("RGB").resize(target, Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    resized.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@dataclass(frozen=True)
class Frame:
    name: str
    data: bytes
    width: int
    height: int


def measure(steps: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call of each step, interleaved round by round (order rotated each round)."""
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
                started = time.perf_counter_ns()
                steps[name]()
                timings[name].append((time.perf_counter_ns() - started) / 1e6)
    finally:
        gc.enable()
    return timings


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed calls per step (default 200)")
    args = parser.parse_args()

    limits, grid = ImageLimits(), TokenGrid()
    frames = [
        Frame("1280×720", photo_jpeg(1280, 720, noise=3.0), 1280, 720),
        Frame("1920×1080", photo_jpeg(1920, 1080, noise=3.7), 1920, 1080),
    ]
    extras = [
        Frame("2176×1216 (2× target: DCT half-scale)", photo_jpeg(2176, 1216, noise=3.0), 2176, 1216),
        Frame("1088×608 (on the grid: passthrough)", photo_jpeg(1088, 608, noise=3.0), 1088, 608),
    ]
    print(
        f"Pillow {PIL.__version__}, libjpeg-turbo {features.version('libjpeg_turbo')}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, one thread; "
        f"grid {grid.pixels_per_token}px, budget {grid.token_budget} tokens; {args.rounds} rounds"
    )
    header = f"{'frame':<42} {'step':<12} {'median ms':>9} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for frame in frames + extras:
        target = smart_resize(frame.width, frame.height, grid)
        shaped = shape_image(frame.data, limits, grid)
        steps: dict[str, Callable[[], object]] = {
            "decode only": functools.partial(decode_only, frame.data),
            "naive": functools.partial(naive, frame.data, target),
            "shape_image": functools.partial(shape_image, frame.data, limits, grid),
        }
        timings = measure(steps, args.rounds)
        label = f"{frame.name}, {len(frame.data) / 1024:.0f} KiB"
        for name, values in timings.items():
            print(f"{label:<42} {name:<12} {statistics.median(values):>9.2f} {p99(values):>8.2f}")
            label = ""
        ratio = statistics.median(timings["shape_image"]) / statistics.median(timings["decode only"])
        naive_ratio = statistics.median(timings["naive"]) / statistics.median(timings["decode only"])
        out = (
            f"{shaped.width}×{shaped.height}, {shaped.image_tokens} tokens, {len(shaped.data) / 1024:.0f} KiB"
        )
        print(
            f"{'':<42} shape_image / decode only = {ratio:.2f}× (naive {naive_ratio:.2f}×); out {out}"
            f"{', passthrough' if shaped.passthrough else ''}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
