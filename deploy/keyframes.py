"""Synthetic keyframes whose ground-truth verdict is drawn into the pixels.

A keyframe carries its label as two flat, saturated squares in its top corners, a colour per label. The
engine simulator reads them back after any shaping (resize, re-encode), so tests, benchmarks and the
quality module have a ground truth without any real model. Frames without the squares are "allow".
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

# label -> marker colour. "allow" frames carry no marker at all.
LABEL_COLOURS: dict[str, tuple[int, int, int]] = {
    "review": (250, 220, 0),
    "block:sexual": (235, 30, 30),
    "block:sexual/minors": (120, 0, 60),
    "block:violence": (255, 130, 0),
    "block:violence/graphic": (140, 0, 0),
    "block:self-harm": (210, 0, 210),
    "block:hate": (0, 60, 255),
    "block:harassment": (0, 200, 220),
    "block:illicit": (0, 160, 40),
}
LABELS: tuple[str, ...] = ("allow", *LABEL_COLOURS)


@dataclass(frozen=True, slots=True)
class Label:
    """A ground-truth label: the action and, for blocks, the category."""

    action: str
    category: str | None = None

    @classmethod
    def parse(cls, label: str) -> Label:
        """``"allow"``, ``"review"`` or ``"block:<category>"``."""
        if label not in LABELS:
            raise ValueError(f"unknown keyframe label {label!r}; expected one of {', '.join(LABELS)}")
        action, _, category = label.partition(":")
        return cls(action, category or None)

    def __str__(self) -> str:
        return f"{self.action}:{self.category}" if self.category else self.action


def marker_size(width: int, height: int) -> int:
    """Side of each marker square: large enough to survive a resize to a few hundred pixels."""
    return max(8, min(width, height) // 6)


def render_keyframe(label: str = "allow", width: int = 1280, height: int = 720, seed: int = 0) -> Image.Image:
    """A photo-like frame (gradients, shapes, sensor noise) with the label's marker squares."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(40, 200, size=3)
    tilt = rng.uniform(-0.08, 0.08, size=(3, 2))
    channels = [base[c] + tilt[c, 0] * x + tilt[c, 1] * y for c in range(3)]
    pixels = np.stack(channels, axis=-1)
    pixels += rng.normal(0, 6, size=pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(20, width // 3)), y0 + int(rng.integers(20, height // 3))
        colour = tuple(int(v) for v in rng.integers(30, 200, size=3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
    if label != "allow":
        colour = LABEL_COLOURS[str(Label.parse(label))]
        side = marker_size(width, height)
        draw.rectangle((0, 0, side - 1, side - 1), fill=colour)
        draw.rectangle((width - side, 0, width - 1, side - 1), fill=colour)
    return image


def make_keyframe(
    label: str = "allow", width: int = 1280, height: int = 720, seed: int = 0, quality: int = 90
) -> bytes:
    """JPEG bytes of :func:`render_keyframe`."""
    buffer = io.BytesIO()
    render_keyframe(label, width, height, seed).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def read_label(image: Image.Image) -> Label:
    """Read the marker back: both corner squares flat and of one label's colour, else "allow"."""
    rgb = image.convert("RGB")
    width, height = rgb.size
    side = marker_size(width, height)
    inset = max(1, side // 5)  # stay clear of the edges that resizing and JPEG blur
    boxes = [
        (inset, inset, side - inset, side - inset),
        (width - side + inset, inset, width - inset, side - inset),
    ]
    means = []
    for box in boxes:
        patch = np.asarray(rgb.crop(box), dtype=np.float32)
        if patch.size == 0 or float(patch.std(axis=(0, 1)).max()) > 12:
            return Label("allow")
        means.append(patch.mean(axis=(0, 1)))
    best, best_distance = "allow", 1e9
    for name, colour in LABEL_COLOURS.items():
        distance = max(float(np.abs(mean - np.array(colour)).max()) for mean in means)
        if distance < best_distance:
            best, best_distance = name, distance
    return Label.parse(best) if best_distance < 40 else Label("allow")


def write_dataset(directory: str, videos: int, frames_per_video: int, seed: int = 0) -> int:
    """A folder per video of labelled JPEG keyframes (mostly allow, as live traffic is); answers the count."""
    import random
    from pathlib import Path

    rng = random.Random(seed)
    weights = [0.9, 0.03] + [0.07 / (len(LABELS) - 2)] * (len(LABELS) - 2)
    written = 0
    for video in range(videos):
        folder = Path(directory) / f"video-{video:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        for frame in range(frames_per_video):
            label = rng.choices(LABELS, weights)[0]
            name = f"{frame:03d}-{label.replace(':', '-').replace('/', '_')}.jpg"
            (folder / name).write_bytes(make_keyframe(label, 640, 360, seed=seed * 1_000_003 + written))
            written += 1
    return written


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a folder of synthetic, labelled keyframes.")
    parser.add_argument("directory")
    parser.add_argument("--videos", type=int, default=40)
    parser.add_argument("--frames", type=int, default=10, help="keyframes per video")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    count = write_dataset(args.directory, args.videos, args.frames, args.seed)
    print(f"wrote {count} keyframes in {args.videos} video folders under {args.directory}")
