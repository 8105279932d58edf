"""Which decoded frames cover a video: the clock, shot changes, and verdicts reused between look-alikes.

Every decoded frame must lie at most ``max_gap_ms`` after a covered frame (judged by the engine, or one
whose verdict is reused from an identical-looking judged frame). The first decoded frame is covered; a
shot change (a scene score at least the threshold) is covered; and when a frame would be more than
``max_gap_ms`` after the last covered one, the frame before it is covered instead (or, when there is no
frame in between, this one). A covered frame that looks like a judged one (the caller's likeness: the
gateway's near-duplicate rule) reuses that verdict instead of going to the engine, so a still shot costs
one engine call however long it lasts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Identity = tuple[int, bytes]
"""A frame's look: its 64-bit pHash and 16×9 RGB thumbnail (shaping.image.identity)."""
Likeness = Callable[[Identity, Identity], bool]
"""Whether two frames look the same (their verdict may be shared)."""
CutReason = Literal["start", "scene", "clock"]


@dataclass(frozen=True, slots=True)
class Covered:
    """A covered frame: where it is, why it was taken, and the judged frame whose verdict it carries."""

    timestamp_ms: int
    reason: CutReason
    judged: int  # index into the cut's judged frames (its own, when it was judged itself)
    reused: bool


@dataclass(frozen=True, slots=True)
class Coverage:
    """How well the frames cover the video, as decoded: the result's ``coverage``."""

    max_gap_ms: int  # the longest any decoded frame lies after the last covered frame before it
    frames_decoded: int
    candidates: int  # frames covered (judged or reused)
    judged: int  # frames sent to the engine
    reused: int  # covered frames whose verdict is a judged look-alike's
    complete: bool  # every decoded frame within the asked max_gap_ms (false: a sparser sample was asked for)


def largest_gap(covered_ms: list[int], decoded_ms: list[int]) -> int:
    """The longest any decoded frame lies after the last covered frame at or before it (both sorted)."""
    gap, index, last = 0, 0, None
    for timestamp in decoded_ms:
        while index < len(covered_ms) and covered_ms[index] <= timestamp:
            last = covered_ms[index]
            index += 1
        gap = max(gap, timestamp - (last if last is not None else timestamp))
    return gap
