"""The simulator's ground truth for one frame: how hard it is, and what each thinking mode answers.

Every frame gets a difficulty drawn deterministically from its identity (the image's ``uuid``, which the
gateway sets to the shaped frame's SHA-256), so a test or a benchmark can ask what the simulator will do
with a frame before sending it. The model is binormal, as the design notes ask:

- a share ``disagreement`` of frames (6 % by default) get a different verdict with thinking off;
- each frame has a latent score ``s``: N(0, 1) for the others, N(mu, 1) for those, with
  ``mu = sqrt(2) * Phi^-1(separation)``, so the AUROC of ``s`` against "thinking off changed the verdict"
  is ``separation`` (0.85 by default) in the population;
- the thinking-off verdict's confidence falls as ``s`` rises (``1/3 + 2/3 * Phi(2 - s)``): the AUROC of
  low confidence against disagreement is the same ``separation``, since a monotone map keeps the ranks.

With thinking on the answer is the frame's label (what ``deploy.keyframes`` drew) and its confidence is
higher (``1/3 + 2/3 * Phi(3 - s / 2)``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist

from deploy.keyframes import Label

_NORMAL = NormalDist()
FLIP_CATEGORY = "violence"  # the category a thinking-off false positive names


@dataclass(frozen=True, slots=True)
class SimVerdict:
    """A verdict as the simulated model writes it."""

    action: str
    categories: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FrameTruth:
    """What the simulator will answer for one frame, in each thinking mode."""

    identity: str
    difficulty: float  # Phi(s), in (0, 1): higher is harder (lower confidence, likelier to flip)
    flips_without_thinking: bool  # the thinking-off verdict differs from the thinking-on one
    thinking_on: SimVerdict
    thinking_off: SimVerdict
    confidence_on: float  # P(action) the simulated engine's logprobs give with thinking on
    confidence_off: float  # ... and with thinking off

    def verdict(self, thinking: bool) -> SimVerdict:
        """The verdict in one mode."""
        return self.thinking_on if thinking else self.thinking_off

    def confidence(self, thinking: bool) -> float:
        """The confidence in one mode."""
        return self.confidence_on if thinking else self.confidence_off


def _uniform(identity: str, purpose: str) -> float:
    """A deterministic draw in (0, 1) from a frame's identity."""
    digest = hashlib.sha256(f"{identity}:{purpose}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") + 0.5) / 2**64


def separation_shift(separation: float) -> float:
    """The binormal mean shift ``mu`` whose AUROC is ``separation``: ``Phi(mu / sqrt 2) = separation``."""
    if not 0.5 <= separation < 1:
        raise ValueError(f"separation must be in [0.5, 1), got {separation}")
    return math.sqrt(2) * _NORMAL.inv_cdf(separation)


def frame_truth(identity: str, label: Label, *, disagreement: float, separation: float) -> FrameTruth:
    """The simulator's ground truth for the frame ``identity`` whose drawn label is ``label``."""
    flips = _uniform(identity, "thinking-off") < disagreement
    score = _NORMAL.inv_cdf(_uniform(identity, "difficulty")) + (separation_shift(separation) if flips else 0)
    on = SimVerdict(label.action, (label.category,) if label.category else ())
    if not flips:
        off = on
    elif on.action == "allow":
        off = SimVerdict("block", (FLIP_CATEGORY,))
    else:
        off = SimVerdict("allow", ())
    return FrameTruth(
        identity=identity,
        difficulty=_NORMAL.cdf(score),
        flips_without_thinking=flips,
        thinking_on=on,
        thinking_off=off,
        confidence_on=round(1 / 3 + 2 / 3 * _NORMAL.cdf(3 - score / 2), 4),
        confidence_off=round(1 / 3 + 2 / 3 * _NORMAL.cdf(2 - score), 4),
    )
