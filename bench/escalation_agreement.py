"""Escalation's agreement with thinking on: measured through the gateway, beside what the simulator assumes.

What is **assumed** (the simulator's model of the production model, ``deploy.simulator.truth``, from the
preset in force): a share ``d`` of frames (6 %) get another verdict with thinking off, and the fast
verdict's confidence separates them from the rest with a binormal AUROC (0.85): a latent score s is N(0, 1),
or N(mu, 1) for a frame that flips, with mu = sqrt(2) Phi^-1(AUROC), and the fast confidence is
1/3 + 2/3 Phi(2 - s). Those give, in closed form, what escalating below a threshold T should agree:

    a flipped frame stands (is not re-asked) when its confidence >= T: s <= c = 2 - Phi^-1((3T - 1) / 2)
    expected agreement = 1 - d Phi(c - mu)
    expected escalated = P(review) (1 - d) + (1 - P(review)) (1 - d) (1 - Phi(c)) + d (1 - Phi(c - mu))

(a flipped fast verdict is never ``review`` and never names an always-escalated category; a review always
escalates). That is :func:`expected_agreement`: arithmetic on the preset's two numbers, not the code path.

What is **measured** (:func:`measure`): labelled keyframes posted to the gateway in ``escalate`` mode (the
simulator's logprobs, the gateway's confidence reading, the threshold, the re-ask), each answer compared
with the same frame asked with thinking on through the same gateway, and the share that agree with its
95 % Wilson interval (statsmodels). The frames are many enough for the interval to tell 97 % from 99 %.
Time does not enter agreement: the simulator runs at time scale 0.

    python -m bench.escalation_agreement --frames 2000 [--threshold 0.97] [--separation 0.85] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import random
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import httpx
from statsmodels.stats.proportion import proportion_confint

from bench.escalation import ALWAYS, DISAGREEMENT, LABEL_MIX
from bench.servers import gateway, simulator
from deploy.keyframes import make_keyframe
from deploy.simulator.presets import PRESETS, SimPreset
from quality.escalation import escalation_reason, same_verdict

_NORMAL = NormalDist()
ADMIN_TOKEN = "bench-admin-token-0123456789"  # noqa: S105 - a loopback benchmark's own gateway
THRESHOLD = 0.97  # near the weekly report's recommendation for 99 % at separation 0.85 (docs/escalation.md)
REVIEW_SHARE = dict(LABEL_MIX)["review"]


def _flip_cut(threshold: float) -> float:
    """The latent score c below which a fast confidence is at least ``threshold`` (1/3 + 2/3 Phi(2 - s))."""
    level = (3 * threshold - 1) / 2
    if level <= 0:
        return math.inf
    if level >= 1:
        return -math.inf
    return 2 - _NORMAL.inv_cdf(level)


def _shift(separation: float) -> float:
    return math.sqrt(2) * _NORMAL.inv_cdf(separation)


def _phi(x: float) -> float:
    return 1.0 if x == math.inf else 0.0 if x == -math.inf else _NORMAL.cdf(x)


def expected_agreement(threshold: float, separation: float, disagreement: float) -> float:
    """Agreement with thinking on that the simulator's assumptions imply at ``threshold`` (module doc)."""
    return 1 - disagreement * _phi(_flip_cut(threshold) - _shift(separation))


def expected_escalated(
    threshold: float, separation: float, disagreement: float, review_share: float = REVIEW_SHARE
) -> float:
    """The share escalated that the same assumptions imply (``review_share``: frames labelled review)."""
    cut, kept = _flip_cut(threshold), 1 - disagreement
    unsure = (1 - review_share) * kept * (1 - _phi(cut)) + disagreement * (1 - _phi(cut - _shift(separation)))
    return review_share * kept + unsure


# The Spark request escalate runs (docs/escalation.md, "Capacity"): 3,649 prompt tokens of which the
# block-filling prefix's 2,960 are cached; a fast verdict outputs about 3 tokens (verdict and stop), a re-ask
# the reasoning, the closing tag, the verdict and the stop token.
UNCACHED_PROMPT_TOKENS = 3649 - 2960
FAST_OUTPUT_TOKENS = 3


def engine_seconds_per_keyframe(
    escalated: float, preset: SimPreset = PRESETS["spark"], *, uncached_prompt: int = UNCACHED_PROMPT_TOKENS,
    reasoning_tokens: int | None = None,
) -> tuple[float, float]:
    """(prefill, decode) engine seconds per keyframe when a share ``escalated`` is asked again with thinking
    on, from the preset's rates: a prefill costs its tokens at the prefill rate (it stalls the batch), an
    output token 1 / the aggregate decode rate (SimPreset, docs/engineering.md)."""
    reasoning = preset.reasoning_tokens if reasoning_tokens is None else reasoning_tokens
    reask_output = reasoning + FAST_OUTPUT_TOKENS  # the closing tag, the verdict and the stop token
    prefill = uncached_prompt * (1 + escalated) / preset.prefill_tokens_per_s
    decode = (FAST_OUTPUT_TOKENS + escalated * reask_output) / preset.decode_tokens_per_s
    return prefill, decode


def wilson(count: int, frames: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of ``count`` in ``frames`` (statsmodels)."""
    low, high = proportion_confint(count, frames, alpha=0.05, method="wilson")
    return float(low), float(high)


@dataclass(frozen=True, slots=True)
class FrameOutcome:
    """One frame: its fast verdict (with confidence), the answer escalate gave, and thinking on's answer."""

    fast: tuple[str, tuple[str, ...], float | None]
    answered: tuple[str, tuple[str, ...]]
    escalated: bool
    reference: tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class AgreementRun:
    """Agreement with thinking on at one threshold, counted over frames, with the assumptions' expectation.

    ``replayed``: the threshold is below the one the gateway ran, and each frame's answer is decided again
    from its recorded fast verdict (quality.escalation.escalation_reason, the gateway's own rule): a frame
    that stands at the higher threshold stands at the lower one too, so every answer needed was measured.
    """

    threshold: float
    separation: float
    disagreement: float
    frames: int
    agreeing: int
    escalated: int
    flipped: int  # frames whose fast verdict differed from thinking on's (before any escalation)
    expected_agreement: float
    expected_escalated: float
    replayed: bool = False

    @property
    def agreement(self) -> float:
        return self.agreeing / self.frames

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.agreeing, self.frames)

    @property
    def escalated_interval(self) -> tuple[float, float]:
        return wilson(self.escalated, self.frames)

    def as_dict(self) -> dict[str, Any]:
        low, high = self.interval
        return {**asdict(self), "agreement": self.agreement, "interval": [low, high],
                "escalated_share": self.escalated / self.frames,
                "escalated_interval": list(self.escalated_interval)}


def summarise(
    outcomes: Sequence[FrameOutcome], threshold: float, ran_at: float, *, separation: float,
    disagreement: float, always: Collection[str] = ALWAYS,
) -> AgreementRun:
    """Agreement at ``threshold`` from a run of the gateway at ``ran_at`` (``threshold <= ran_at``)."""
    if threshold > ran_at:
        raise ValueError(f"a run at {ran_at:g} cannot say what escalating below {threshold:g} answers")
    agreeing = escalated = flipped = 0
    for frame in outcomes:
        action, categories, confidence = frame.fast
        if threshold == ran_at:
            answer, was_escalated = frame.answered, frame.escalated
        else:
            was_escalated = escalation_reason(action, categories, confidence, threshold, always) is not None
            answer = frame.reference if was_escalated else (action, categories)
        agreeing += same_verdict(*answer, *frame.reference)
        escalated += was_escalated
        flipped += not same_verdict(action, categories, *frame.reference)
    return AgreementRun(
        threshold=threshold, separation=separation, disagreement=disagreement, frames=len(outcomes),
        agreeing=agreeing, escalated=escalated, flipped=flipped,
        expected_agreement=expected_agreement(threshold, separation, disagreement),
        expected_escalated=expected_escalated(threshold, separation, disagreement),
        replayed=threshold != ran_at,
    )


def frame_labels(frames: int, seed: int) -> list[str]:
    """``frames`` labels drawn from the benchmark's label mix (bench.escalation.LABEL_MIX), seeded."""
    rng = random.Random(seed)
    names, weights = zip(*LABEL_MIX, strict=True)
    return rng.choices(names, weights=weights, k=frames)


async def measure(
    http: httpx.AsyncClient, frames: int, threshold: float, *, admin_token: str, seed: int = 0,
    clients: int = 8, size: tuple[int, int] = (320, 180),
) -> list[FrameOutcome]:
    """Post ``frames`` labelled keyframes in ``escalate`` mode below ``threshold`` (no cap), then each again
    with thinking on; what each answered."""
    auth = {"Authorization": f"Bearer {admin_token}"}
    document = (await http.get("/admin/thinking-policy", headers=auth)).json()
    document.update(default_mode="escalate", allow_caller_choice=True, reason="escalation agreement bench")
    # no cap: every unsure frame is re-asked, so what is measured is the threshold's agreement
    document["escalation"] = {**document["escalation"], "threshold": threshold, "max_share": None,
                              "max_per_minute": None, "always_categories": list(ALWAYS)}
    (await http.put("/admin/thinking-policy", json=document, headers=auth)).raise_for_status()
    slots = asyncio.Semaphore(clients)
    retried: list[int] = []

    async def moderate(image: bytes, mode: str | None) -> dict[str, Any]:
        url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
        headers = {"X-Modgate-Thinking": mode} if mode else {}
        body = {"input": [{"type": "image_url", "image_url": {"url": url}}]}
        try:
            response = await http.post("/v1/moderations", json=body, headers=headers)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            response = None
        if response is None or response.status_code == 502:
            # a pooled keep-alive connection closed as it was reused, here or between the gateway and the
            # engine (issue 24 part 5, fixed elsewhere): a moderation is safe to ask again, so it is sent
            # once more, and counted
            retried.append(1)
            response = await http.post("/v1/moderations", json=body, headers=headers)
        response.raise_for_status()
        result: dict[str, Any] = response.json()["results"][0]
        return result

    def verdict(result: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        return result["modgate"]["action"], tuple(c for c, hit in result["categories"].items() if hit)

    async def one(index: int, label: str) -> FrameOutcome:
        async with slots:
            image = make_keyframe(label, *size, seed=seed * 1_000_000 + index)
            answered = await moderate(image, None)
            reference = await moderate(image, "on")
        details = answered["modgate"]
        before = details["escalated_from"]
        if before is None:
            fast = (*verdict(answered), details["confidence"])
        else:
            fast = (before["action"], tuple(before["categories"]), before["confidence"])
        return FrameOutcome(fast, verdict(answered), before is not None, verdict(reference))

    labels = frame_labels(frames, seed)
    outcomes = list(await asyncio.gather(*(one(i, label) for i, label in enumerate(labels))))
    if retried:
        print(f"{len(retried)} requests sent again after the server closed a pooled connection")
    return outcomes


def print_run(run: AgreementRun) -> None:
    low, high = run.interval
    e_low, e_high = run.escalated_interval
    how = " (replayed)" if run.replayed else ""
    print(f"separation {run.separation:g}, flip share {run.disagreement:.0%}, "
          f"escalate below {run.threshold:g}{how}, "
          f"{run.frames} frames: agreement {run.agreement:.2%} [{low:.2%}, {high:.2%}] (expected "
          f"{run.expected_agreement:.2%}); escalated {run.escalated / run.frames:.1%} [{e_low:.1%}, "
          f"{e_high:.1%}] (expected {run.expected_escalated:.1%}); fast verdict differed on "
          f"{run.flipped / run.frames:.1%}")


def print_capacity(measured: Sequence[float]) -> None:
    """The capacity arithmetic with the preset in force, at the measured shares escalated and at none."""
    preset = PRESETS["spark"]
    print(f"engine time per keyframe on the {preset.name} preset "
          f"(prefill {preset.prefill_tokens_per_s:,.0f}, "
          f"decode {preset.decode_tokens_per_s:g} tokens/s; {UNCACHED_PROMPT_TOKENS} uncached prompt tokens "
          f"an ask, {preset.reasoning_tokens} reasoning tokens a re-ask):")
    for share in (0.0, *measured):
        prefill, decode = engine_seconds_per_keyframe(share)
        print(f"  escalated {share:5.1%}: prefill {prefill:.3f} s + decode {decode:.3f} s = "
              f"{prefill + decode:.3f} s, a ceiling of {60 / (prefill + decode):.0f} keyframes/min")


async def _run(args: argparse.Namespace, separation: float) -> list[FrameOutcome]:
    env = {"MODGATE_AUTH__ADMIN_TOKEN": ADMIN_TOKEN, "MODGATE_SHAPING__VERDICT_CACHE_TTL_S": "0"}
    with simulator("spark", 0.0, "--separation", str(separation)) as engine_url, \
            gateway(engine_url, **env) as gateway_url:
        async with httpx.AsyncClient(base_url=gateway_url, timeout=120) as http:
            return await measure(http, args.frames, args.threshold, admin_token=ADMIN_TOKEN, seed=args.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--separation", type=float, nargs="+", default=[PRESETS["spark"].separation_auroc])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", type=float, nargs="*", default=[0.8, 0.9],
                        help="lower thresholds decided again from the same run's fast verdicts")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = []
    for separation in args.separation:
        started = time.monotonic()
        outcomes = asyncio.run(_run(args, separation))
        seconds = round(time.monotonic() - started, 1)
        thresholds = sorted({args.threshold, *(t for t in args.replay if t < args.threshold)}, reverse=True)
        for threshold in thresholds:
            run = summarise(outcomes, threshold, args.threshold, separation=separation,
                            disagreement=DISAGREEMENT)
            print_run(run)
            rows.append({**run.as_dict(), "seconds": seconds})
    print_capacity([row["escalated_share"] for row in rows if not row["replayed"]])
    print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after (2 cores)")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "load_before": load,
                                         "load_after": os.getloadavg()[0]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
