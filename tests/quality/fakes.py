"""Test doubles for the quality tests: synthetic weeks with known rates, and a fake gateway."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from dataclasses import dataclass, field
from datetime import timedelta

import httpx
import numpy as np

from contracts.records import HumanLabel, VerdictRecord, week_bounds

CATEGORIES = ("sexual", "violence", "self-harm", "hate", "illicit")


@dataclass(frozen=True)
class SyntheticWeek:
    """Records with known population rates, so tests can check that the statistics recover them."""

    records: list[VerdictRecord]
    flag_rate: float
    flip_on_flagged: float  # P(thinking off misses | thinking on flagged)
    flip_on_safe: float  # P(thinking off flags | thinking on safe)

    @property
    def disagreement(self) -> float:
        return self.flag_rate * self.flip_on_flagged + (1 - self.flag_rate) * self.flip_on_safe


def synthesize_week(
    *,
    year: int = 2026,
    week: int = 48,
    frames: int = 3000,
    videos: int = 300,
    flag_rate: float = 0.03,
    flip_on_flagged: float = 0.10,
    flip_on_safe: float = 0.0278,
    rerun_fraction: float = 0.0,
    rerun_flip: float = 0.005,
    labels_fraction: float = 0.0,
    concentration: float = 20.0,
    seed: int = 7,
) -> SyntheticWeek:
    """A week of paired verdicts where each video has its own flip rates (Beta around the targets).

    The per-video Beta draws make frames of one video correlated, which is the case the video
    bootstrap exists for; the population rates stay exactly the given ones.
    """
    rng = np.random.default_rng(seed)
    start, _ = week_bounds(year, week)
    video_of = np.sort(rng.integers(0, videos, size=frames))

    def beta(mean: float) -> np.ndarray:
        if mean in (0.0, 1.0):
            return np.full(videos, mean)
        return rng.beta(mean * concentration, (1 - mean) * concentration, size=videos)

    video_flag = beta(flag_rate)
    video_miss = beta(flip_on_flagged)
    video_false = beta(flip_on_safe)
    records: list[VerdictRecord] = []
    for index in range(frames):
        v = int(video_of[index])
        sha = hashlib.sha256(f"{seed}-{index}".encode()).hexdigest()
        on = bool(rng.random() < video_flag[v])
        off = (not on) if rng.random() < (video_miss[v] if on else video_false[v]) else on
        category = CATEGORIES[int(rng.integers(0, len(CATEGORIES)))]
        moment = start + timedelta(seconds=float(rng.uniform(0, 7 * 86400 - 60)))
        label = None
        if rng.random() < labels_fraction:
            # people miss few of thinking on's flags and add a few of their own
            truth = (rng.random() > 0.05) if on else (rng.random() < 0.004)
            label = HumanLabel(flagged=truth, action="block" if truth else "allow")
        arms = [("thinking_on", on), ("thinking_off", off)]
        if rng.random() < rerun_fraction:
            arms.append(("thinking_on_rerun", (not on) if rng.random() < rerun_flip else on))
        for arm, flagged in arms:
            thinking = arm != "thinking_off"
            records.append(
                VerdictRecord(
                    frame_sha256=sha,
                    video_id=f"video-{v:04d}",
                    tenant=("acme", "globex", "initech")[v % 3],
                    arm=arm,  # type: ignore[arg-type]  # one of the three arms above
                    action="block" if flagged else "allow",
                    flagged=flagged,
                    categories=[category] if flagged else [],
                    policy_version=3,
                    prompt_tokens=1076,
                    cached_tokens=0,
                    completion_tokens=int(rng.normal(95, 12)) if thinking else int(rng.integers(4, 8)),
                    reasoning_tokens=int(rng.normal(88, 12)) if thinking else 0,
                    latency_ms=float(rng.lognormal(np.log(8560), 0.18))
                    if thinking
                    else float(rng.lognormal(np.log(620), 0.25)),
                    ttft_ms=float(rng.lognormal(np.log(468), 0.2)),
                    recorded_at=moment + timedelta(seconds=9 if arm != "thinking_on" else 0),
                    source="offline",
                    request_id=f"req-{index}-{arm}",
                    human_label=label,
                )
            )
    return SyntheticWeek(records, flag_rate, flip_on_flagged, flip_on_safe)


# --- a fake gateway ------------------------------------------------------------------------------------


@dataclass
class FakeGateway:
    """Answers `POST /v1/moderations` the way the gateway does, deterministically from the image bytes.

    A frame is flagged with thinking on when its hash falls in the lowest `flag_rate`; thinking off
    flips a further `flip_rate` of frames. Tests read `calls` to see what was sent.
    """

    flag_rate: float = 0.2
    flip_rate: float = 0.1
    policy_version: int = 3
    fail_first: dict[str, int] = field(default_factory=dict)  # frame sha -> errors (503) before success
    calls: list[dict[str, object]] = field(default_factory=list)
    stall_after: int | None = None  # stop answering after this many calls (an interruption)
    seen: set[tuple[str, str]] = field(default_factory=set)
    stall_waiters: int = 1  # `stalled` is set once this many calls hang (one per client worker)
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    _hanging: int = 0

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or request.url.path != "/v1/moderations":
            return _error(404, "not found", "not_found_error")
        body = json.loads(request.content)
        image = body["input"][0]
        header, _, payload = image["image_url"]["url"].partition(",")
        if (
            image.get("type") != "image_url"
            or not header.startswith("data:image/")
            or not header.endswith(";base64")
        ):
            return _error(400, "input must be a base64 data: URL image", "invalid_request_error")
        data = base64.b64decode(payload, validate=True)
        sha = hashlib.sha256(data).hexdigest()
        thinking = request.headers.get("X-Modgate-Thinking")
        if thinking not in ("on", "off"):
            return _error(400, "X-Modgate-Thinking must be on or off", "invalid_request_error")
        if self.stall_after is not None and len(self.calls) >= self.stall_after:
            self._hanging += 1
            if self._hanging >= self.stall_waiters:
                self.stalled.set()
            await asyncio.Event().wait()
        self.calls.append(
            {
                "sha": sha,
                "thinking": thinking,
                "video": request.headers.get("X-Modgate-Video-Id"),
                "cache": request.headers.get("Cache-Control"),
                "model": body["model"],
            }
        )
        if self.fail_first.get(sha, 0) > 0:
            self.fail_first[sha] -= 1
            return _error(503, "engine unavailable", "upstream_error")
        score = int(sha[:8], 16) / 0xFFFFFFFF
        flagged = score < self.flag_rate
        if thinking == "off" and int(sha[8:16], 16) / 0xFFFFFFFF < self.flip_rate:
            flagged = not flagged
        # the gateway's verdict cache: a repeat of (frame, thinking) is served from it unless told not to
        reused = (sha, thinking) in self.seen and request.headers.get("Cache-Control") != "no-cache"
        self.seen.add((sha, thinking))
        categories = {"violence": flagged, "sexual": False}
        result = {
            "flagged": flagged,
            "categories": categories,
            "category_scores": {name: 0.9 if hit else 0.01 for name, hit in categories.items()},
            "modgate": {
                "action": "block" if flagged else "allow",
                "thinking": thinking,
                "policy_version": self.policy_version,
                "latency_ms": 8560.0 if thinking == "on" else 610.0,
                "ttft_ms": 468.0,
                "prompt_tokens": 1076,
                "cached_tokens": 0,
                "completion_tokens": 95 if thinking == "on" else 5,
                "reasoning_tokens": 88 if thinking == "on" else 0,
                "frame_sha256": sha,
                "request_id": f"req-{len(self.calls)}",
                "reused": "exact" if reused else None,
            },
        }
        return httpx.Response(
            200, json={"id": f"modr-{len(self.calls)}", "model": body["model"], "results": [result]}
        )


def _error(status: int, message: str, kind: str) -> httpx.Response:
    """The OpenAI error shape the gateway answers with."""
    return httpx.Response(
        status, json={"error": {"message": message, "type": kind, "param": None, "code": None}}
    )
