"""Judged frames merged into segments: consecutive frames of one action and one category set are one range."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FrameVerdict:
    """One judged frame: where it is, and what was decided."""

    index: int
    timestamp_ms: int
    action: str
    categories: tuple[str, ...]
    confidence: float | None


@dataclass(frozen=True, slots=True)
class Segment:
    """A time range of one verdict: from its first frame to where the next segment begins."""

    start_ms: int
    end_ms: int
    action: str
    categories: tuple[str, ...]
    frames: tuple[int, ...]
    confidence: float | None  # the lowest of its frames' (None when no frame has one)


def merge_segments(frames: list[FrameVerdict], duration_ms: int) -> list[Segment]:
    """Consecutive frames (in time order) of equal action and categories as one segment.

    The first segment starts at 0 (what comes before the first cut frame looks like it), each ends where
    the next begins, the last at ``duration_ms`` (or its last frame's time, if the container said less).
    A segment's confidence is the lowest of its frames': the segment is as sure as its least sure frame.
    """
    ordered = sorted(frames, key=lambda frame: (frame.timestamp_ms, frame.index))
    runs: list[list[FrameVerdict]] = []
    for frame in ordered:
        if runs and (runs[-1][-1].action, runs[-1][-1].categories) == (frame.action, frame.categories):
            runs[-1].append(frame)
        else:
            runs.append([frame])
    segments = []
    for number, run in enumerate(runs):
        start = 0 if number == 0 else run[0].timestamp_ms
        last = number + 1 == len(runs)
        end = max(duration_ms, run[-1].timestamp_ms) if last else runs[number + 1][0].timestamp_ms
        confidences = [frame.confidence for frame in run if frame.confidence is not None]
        segments.append(Segment(
            start_ms=start,
            end_ms=end,
            action=run[0].action,
            categories=run[0].categories,
            frames=tuple(frame.index for frame in run),
            confidence=min(confidences) if confidences else None,
        ))
    return segments
