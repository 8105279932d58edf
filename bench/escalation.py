"""What ``escalate`` needs from ``bench/capacity``: labelled keyframes, the simulator's ground truth, the
threshold the weekly report would recommend, and agreement with thinking on.

The simulator decides every frame's verdicts from its identity (the shaped frame's SHA-256, which the
gateway sends as the image's ``uuid``) and its label (``deploy.simulator.truth``): thinking on answers the
label, thinking off a different verdict for 6 % of frames, with a confidence whose separation of those
frames from the rest is the preset's (AUROC 0.85 by default). So a benchmark knows, for every answer,
what thinking on would have said.

The threshold is chosen once, as an operator would: the weekly report's threshold section over a large
random sample of the simulator's ground truth at the default separation (0.85), its recommendation for
99 % agreement. The same threshold then runs at 0.75 and 0.95 too: the target is judged at the default,
never at a separation picked to meet it.
"""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from contracts.records import PairedRecord, VerdictRecord
from deploy.keyframes import Label, make_keyframe
from deploy.simulator.presets import PRESETS
from deploy.simulator.truth import frame_truth
from quality.escalation import ThresholdSection, same_verdict, threshold_section

# The labels of the benchmark's keyframes: mostly allowed, some blocked, a few for review (those always
# escalate). A guess at a moderation stream, stated so the escalated share can be read against it.
LABEL_MIX: tuple[tuple[str, float], ...] = (("allow", 0.90), ("block:violence", 0.07), ("review", 0.03))
SEPARATIONS = (0.75, 0.85, 0.95)
DEFAULT_SEPARATION = PRESETS["spark"].separation_auroc
DISAGREEMENT = PRESETS["spark"].thinking_off_disagreement
TARGET_AGREEMENT = 0.99
ALWAYS = ("sexual/minors",)


def labels(count: int, seed: int = 0) -> list[str]:
    """``count`` labels drawn from :data:`LABEL_MIX` (seeded)."""
    rng = random.Random(seed)
    names, weights = zip(*LABEL_MIX, strict=True)
    return rng.choices(names, weights=weights, k=count)


def labelled_pool(size: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Distinct keyframes at the Spark's request shape (1056×640: 660 tokens), as data URLs, and labels."""
    drawn = labels(size, seed)
    urls = [
        "data:image/jpeg;base64," + base64.b64encode(make_keyframe(label, 1056, 640, seed=5000 + i)).decode()
        for i, label in enumerate(drawn)
    ]
    return urls, drawn


def _record(
    identity: str, arm: str, action: str, categories: Sequence[str], confidence: float | None, index: int
) -> VerdictRecord:
    return VerdictRecord.model_validate(
        {
            "frame_sha256": identity,
            "video_id": None,
            "tenant": "bench",
            "arm": arm,
            "action": action,
            "flagged": action != "allow",
            "categories": list(categories),
            "policy_version": 1,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "reasoning_tokens": 0,
            "latency_ms": 0.0,
            "recorded_at": datetime(2026, 11, 30, tzinfo=UTC) + timedelta(seconds=index),
            "source": "offline",
            "request_id": f"truth-{index}",
            "confidence": confidence,
            "selection": "random",
            "selection_probability": 1.0,
        }
    )


def truth_pairs(separation: float, frames: int = 20_000, seed: int = 0) -> list[PairedRecord]:
    """A random sample of the simulator's ground truth as thinking on/off pairs (fast confidence kept)."""
    pairs = []
    for index, label_text in enumerate(labels(frames, seed)):
        identity = hashlib.sha256(f"truth-{seed}-{index}".encode()).hexdigest()
        truth = frame_truth(
            identity, Label.parse(label_text), disagreement=DISAGREEMENT, separation=separation
        )
        on, off = truth.thinking_on, truth.thinking_off
        reference = _record(identity, "thinking_on", on.action, on.categories, truth.confidence_on, index)
        candidate = _record(identity, "thinking_off", off.action, off.categories, truth.confidence_off, index)
        pairs.append(
            PairedRecord(frame_sha256=identity, policy_version=1, reference=reference, candidate=candidate)
        )
    return pairs


def threshold_table(separation: float = DEFAULT_SEPARATION, frames: int = 20_000) -> ThresholdSection:
    """The weekly report's threshold section on the simulator's ground truth."""
    section = threshold_section(
        truth_pairs(separation, frames), always=ALWAYS, target=TARGET_AGREEMENT, resamples=400
    )
    assert section is not None  # frames > 0
    return section


def agrees_with_thinking_on(
    frame_sha256: str, label: str, separation: float, action: str, categories: Sequence[str]
) -> bool:
    """Whether an answer is what thinking on answers for this frame in the simulator."""
    truth = frame_truth(frame_sha256, Label.parse(label), disagreement=DISAGREEMENT, separation=separation)
    on = truth.thinking_on
    return same_verdict(action, categories, on.action, on.categories)
