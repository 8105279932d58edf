"""The offline A/B runner: every keyframe of a dataset through the gateway under each arm.

A dataset is a folder of images (jpg/png/webp; a frame's video is its sub-folder) or a manifest
(CSV or JSONL with `path`, optional `video_id`, optional `label` or `flagged`). Each frame's arms are
sent back to back, so both see the same engine load and the same policy version. Every verdict is
appended to the store as soon as it arrives; a re-run skips (frame bytes, arm) pairs the store already
holds, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contracts.records import ARM_SETTINGS, ARMS, Arm, HumanLabel, RecordStore, VerdictRecord
from shaping.verdict import ACTIONS, Action

__all__ = [
    "IMAGE_TYPES",
    "DatasetError",
    "GatewayError",
    "Keyframe",
    "LabelTable",
    "ProgressEvent",
    "RunSummary",
    "completed_work",
    "load_dataset",
    "load_labels",
    "parse_arms",
    "run_offline",
]

logger = logging.getLogger(__name__)

IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp"}
THINKING_HEADER: dict[Arm, Literal["on", "off"]] = {arm: mode for arm, (mode, _) in ARM_SETTINGS.items()}
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class DatasetError(ValueError):
    """The dataset, manifest or labels file cannot be used as given; the message says why."""


class GatewayError(Exception):
    """The gateway refused a frame or answered in a shape the runner cannot record."""


# --- datasets and labels ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Keyframe:
    path: Path
    key: str  # the path as the dataset names it (relative posix path): what labels join on
    video_id: str | None = None
    label: HumanLabel | None = None


def parse_label(row: dict[str, str | None]) -> HumanLabel | None:
    """A `label` column (allow/review/block; review counts as flagged) or a `flagged` 0/1 column."""
    raw_label = (row.get("label") or "").strip().lower()
    if raw_label:
        if raw_label not in ACTIONS:
            named = f"{', '.join(ACTIONS[:-1])} or {ACTIONS[-1]}"  # "allow, review or block"
            raise DatasetError(f"label must be {named}, got {raw_label!r}")
        action: Action = raw_label  # narrowed by the check above
        return HumanLabel(flagged=action != "allow", action=action)
    raw_flagged = (row.get("flagged") or "").strip().lower()
    if raw_flagged:
        if raw_flagged not in ("0", "1", "true", "false", "yes", "no"):
            raise DatasetError(f"flagged must be 0 or 1, got {raw_flagged!r}")
        return HumanLabel(flagged=raw_flagged in ("1", "true", "yes"))
    return None


def _rows(path: Path) -> list[dict[str, str | None]]:
    try:
        if path.suffix.lower() == ".jsonl":
            rows = []
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                value = json.loads(line)
                if not isinstance(value, dict):
                    raise DatasetError(f"{path}:{number}: each line must be a JSON object")
                rows.append({str(k): None if v is None else str(v) for k, v in value.items()})
            return rows
        with path.open(encoding="utf-8", newline="") as handle:
            return [{str(k): v for k, v in row.items()} for row in csv.DictReader(handle)]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc


def load_dataset(source: Path) -> list[Keyframe]:
    """Keyframes from a folder of images or a CSV/JSONL manifest, in a stable order."""
    if source.is_dir():
        frames = []
        for path in sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_TYPES and p.is_file()):
            relative = path.relative_to(source)
            parent = relative.parent.as_posix()
            frames.append(
                Keyframe(path=path, key=relative.as_posix(), video_id=None if parent == "." else parent)
            )
        if not frames:
            raise DatasetError(f"no .jpg, .png or .webp images under {source}")
        return frames
    if not source.is_file():
        raise DatasetError(f"{source} is neither a folder of images nor a manifest file")
    if source.suffix.lower() not in (".csv", ".jsonl"):
        raise DatasetError(f"a manifest must be .csv or .jsonl, got {source.name}")
    frames, missing = [], []
    for number, row in enumerate(_rows(source), start=1):
        raw_path = (row.get("path") or "").strip()
        if not raw_path:
            raise DatasetError(f"{source}: row {number} has no path")
        path = Path(raw_path) if Path(raw_path).is_absolute() else source.parent / raw_path
        if not path.is_file():
            missing.append(raw_path)
            continue
        if path.suffix.lower() not in IMAGE_TYPES:
            raise DatasetError(f"{source}: row {number}: {raw_path} is not a .jpg, .png or .webp image")
        video = (row.get("video_id") or "").strip() or None
        frames.append(Keyframe(path=path, key=raw_path, video_id=video, label=parse_label(row)))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DatasetError(f"{source}: {len(missing)} listed images do not exist: {shown}")
    if not frames:
        raise DatasetError(f"{source} lists no images")
    return frames


@dataclass(frozen=True)
class LabelTable:
    """Human labels keyed by dataset path and by sha256 (of the file, or the gateway's frame hash)."""

    by_path: dict[str, HumanLabel] = field(default_factory=dict)
    by_sha256: dict[str, HumanLabel] = field(default_factory=dict)

    def find(self, keyframe: Keyframe, *hashes: str) -> HumanLabel | None:
        for key in (keyframe.key, str(keyframe.path)):
            if key in self.by_path:
                return self.by_path[key]
        for digest in hashes:
            if digest in self.by_sha256:
                return self.by_sha256[digest]
        return keyframe.label

    def __len__(self) -> int:
        return len(self.by_path) + len(self.by_sha256)


def load_labels(path: Path) -> LabelTable:
    """A labels CSV with `path` or `frame_sha256`, and `label` (allow/review/block) or `flagged` (0/1)."""
    table = LabelTable()
    for number, row in enumerate(_rows(path), start=1):
        label = parse_label(row)
        if label is None:
            raise DatasetError(f"{path}: row {number} has neither a label nor a flagged value")
        key_path = (row.get("path") or "").strip()
        key_sha = (row.get("frame_sha256") or "").strip().lower()
        if key_path:
            table.by_path[key_path] = label
        elif key_sha:
            table.by_sha256[key_sha] = label
        else:
            raise DatasetError(f"{path}: row {number} has neither path nor frame_sha256")
    return table


def parse_arms(text: str) -> list[Arm]:
    arms: list[Arm] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in ARMS:
            raise DatasetError(f"unknown arm {name!r}: choose from {', '.join(ARMS)}")
        if name not in arms:
            arms.append(name)
    if not arms:
        raise DatasetError("name at least one arm")
    return arms


# --- the gateway's answer -------------------------------------------------------------------------------


class _ModgateFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    action: Action
    thinking: Literal["on", "off"]
    policy_version: int = Field(ge=0)
    latency_ms: float = Field(ge=0)
    ttft_ms: float | None = None
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)
    frame_sha256: str | None = None
    request_id: str
    confidence: float | None = Field(default=None, ge=0, le=1)
    verdict_format: Literal["compact", "json"] | None = None  # None: a gateway from before the field
    engine: str | None = None  # the kind of engine that judged it, when the gateway says
    # the gateway says how a verdict was reused ("exact", "near") or null; a bool is accepted too
    reused: bool | Literal["exact", "near"] | None = None

    @property
    def was_reused(self) -> bool:
        return self.reused not in (None, False)


class _ModerationResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float] = Field(default_factory=dict)
    # project-only
    modgate: _ModgateFields


class _ModerationResponse(BaseModel):
    model_config = ConfigDict(extra="ignore")

    results: list[_ModerationResult] = Field(min_length=1)


# --- running ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgressEvent:
    keyframe: Keyframe
    arm: Arm
    outcome: Literal["sent", "skipped", "failed"]
    detail: str = ""
    engine: str = "vllm"


@dataclass
class RunSummary:
    sent: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    labelled: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def total_failed(self) -> int:
        return sum(self.failed.values())


async def completed_work(store: RecordStore) -> set[tuple[str, Arm, str]]:
    """(input sha256, arm, engine) already recorded by offline runs: the work a resumed run skips."""
    records = await store.read_range(None, None)
    return {(r.input_sha256, r.arm, r.engine) for r in records if r.source == "offline" and r.input_sha256}


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{response.status_code} {error.get('type', '')}: {error.get('message', '')}".strip()
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:200]}"


def _retry_after(response: httpx.Response, default: float) -> float:
    try:
        return min(max(float(response.headers.get("Retry-After", default)), 0.0), 60.0)
    except ValueError:
        return default


@dataclass
class _Run:
    engines: Sequence[tuple[str, httpx.AsyncClient]]  # (engine kind, client based at its gateway)
    store: RecordStore
    arms: Sequence[Arm]
    model: str
    tenant: str
    labels: LabelTable
    retry_delays: Sequence[float]
    on_progress: Callable[[ProgressEvent], None] | None
    done: set[tuple[str, Arm, str]]
    summary: RunSummary = field(default_factory=RunSummary)

    def _report(self, event: ProgressEvent) -> None:
        if self.on_progress is not None:
            self.on_progress(event)

    async def post(
        self, client: httpx.AsyncClient, keyframe: Keyframe, arm: Arm, data_url: str
    ) -> _ModerationResult:
        headers: dict[str, str] = {"X-Modgate-Thinking": THINKING_HEADER[arm]}
        if keyframe.video_id is not None:
            headers["X-Modgate-Video-Id"] = keyframe.video_id
        if arm == "thinking_on_rerun":
            # A re-run must reach the engine: a cached thinking-on verdict would fake a zero noise floor.
            headers["Cache-Control"] = "no-cache"
        # The header is the documented switch; the body options say the same for gateways that read those.
        verdict_format = ARM_SETTINGS[arm][1]
        options: dict[str, str] = {"thinking": THINKING_HEADER[arm], "verdict_format": verdict_format}
        if keyframe.video_id is not None:
            options["video_id"] = keyframe.video_id
        body = {
            "model": self.model,
            "input": [{"type": "image_url", "image_url": {"url": data_url}}],
            "modgate": options,
        }
        for attempt, delay in enumerate([*self.retry_delays, None]):
            try:
                response = await client.post("/v1/moderations", json=body, headers=headers)
            except httpx.TransportError as exc:
                if delay is None:
                    raise GatewayError(f"gateway unreachable after {attempt + 1} tries: {exc!r}") from exc
                await asyncio.sleep(delay)
                continue
            if response.status_code in RETRYABLE_STATUS and delay is not None:
                await asyncio.sleep(_retry_after(response, delay))
                continue
            if response.status_code != 200:
                raise GatewayError(_error_message(response))
            try:
                result = _ModerationResponse.model_validate_json(response.content).results[0]
            except ValidationError as exc:
                raise GatewayError(f"unexpected moderation response: {exc.errors()[0]['msg']}") from exc
            if result.modgate.thinking != THINKING_HEADER[arm]:
                raise GatewayError(
                    f"asked for thinking {THINKING_HEADER[arm]}, the gateway ran thinking "
                    f"{result.modgate.thinking}: does its thinking policy allow per-request choice?"
                )
            if result.modgate.verdict_format not in (None, verdict_format):
                raise GatewayError(
                    f"asked for the {verdict_format} verdict, the gateway answered in the "
                    f"{result.modgate.verdict_format} one: does its thinking policy allow per-request choice?"
                )
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def frame(self, keyframe: Keyframe) -> None:
        data = await asyncio.to_thread(keyframe.path.read_bytes)
        input_sha = hashlib.sha256(data).hexdigest()
        media_type = IMAGE_TYPES[keyframe.path.suffix.lower()]
        data_url = f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"
        for engine, client in self.engines:
            for arm in self.arms:
                await self._judge(client, engine, keyframe, arm, input_sha, data_url)

    async def _judge(
        self,
        client: httpx.AsyncClient,
        engine: str,
        keyframe: Keyframe,
        arm: Arm,
        input_sha: str,
        data_url: str,
    ) -> None:
        """One arm of one frame on one engine, recorded (or counted as skipped or failed)."""
        key = f"{arm}@{engine}" if len(self.engines) > 1 else arm
        if (input_sha, arm, engine) in self.done:
            self.summary.skipped[key] += 1
            self._report(ProgressEvent(keyframe, arm, "skipped", engine=engine))
            return
        try:
            result = await self.post(client, keyframe, arm, data_url)
            if result.modgate.engine not in (None, engine):
                raise GatewayError(
                    f"this gateway's engine is {result.modgate.engine}, the run names it {engine}: "
                    "give each gateway URL the kind of the engine behind it"
                )
        except GatewayError as exc:
            self.summary.failed[key] += 1
            if len(self.summary.errors) < 20:
                self.summary.errors.append(f"{keyframe.key} [{key}]: {exc}")
            self._report(ProgressEvent(keyframe, arm, "failed", str(exc), engine=engine))
            return
        fields = result.modgate
        frame_sha = (fields.frame_sha256 or input_sha).lower()
        label = self.labels.find(keyframe, input_sha, frame_sha)
        record = VerdictRecord(
            frame_sha256=frame_sha,
            video_id=keyframe.video_id,
            tenant=self.tenant,
            arm=arm,
            action=fields.action,
            flagged=result.flagged,
            categories=sorted(name for name, hit in result.categories.items() if hit),
            policy_version=fields.policy_version,
            prompt_tokens=fields.prompt_tokens,
            cached_tokens=fields.cached_tokens,
            completion_tokens=fields.completion_tokens,
            reasoning_tokens=fields.reasoning_tokens,
            latency_ms=fields.latency_ms,
            ttft_ms=fields.ttft_ms,
            recorded_at=datetime.now(UTC),
            source="offline",
            request_id=fields.request_id,
            reused=fields.was_reused,
            input_sha256=input_sha,
            human_label=label,
            confidence=fields.confidence,
            engine=engine,
        )
        await self.store.append(record)
        self.done.add((input_sha, arm, engine))
        self.summary.sent[key] += 1
        self.summary.labelled += label is not None
        self._report(ProgressEvent(keyframe, arm, "sent", engine=engine))


async def run_offline(
    keyframes: Iterable[Keyframe],
    arms: Sequence[Arm],
    *,
    client: httpx.AsyncClient,
    store: RecordStore,
    model: str = "modgate",
    tenant: str = "offline",
    labels: LabelTable | None = None,
    concurrency: int = 4,
    retry_delays: Sequence[float] = (0.5, 1.0, 2.0, 4.0),
    on_progress: Callable[[ProgressEvent], None] | None = None,
    engine: str = "vllm",
    other_engines: Sequence[tuple[str, httpx.AsyncClient]] = (),
) -> RunSummary:
    """Send each keyframe under each arm through `client` (based at the gateway), recording verdicts.

    At most `concurrency` frames are in flight; a frame's arms go one after another. Frames whose
    (bytes, arm, engine) the store already holds are skipped. Refused frames are counted, not fatal.
    The engine is an arm too: `engine` names the kind behind `client`'s gateway, and each of
    `other_engines` (kind, client at a gateway in front of that engine) judges every frame under every
    arm as well, so the weekly report compares one engine's verdicts with the other's.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    kinds = [engine, *(kind for kind, _ in other_engines)]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"each engine must be of a different kind to be told apart, got {kinds}")
    run = _Run(
        engines=[(engine, client), *other_engines],
        store=store,
        arms=list(arms),
        model=model,
        tenant=tenant,
        labels=labels or LabelTable(),
        retry_delays=retry_delays,
        on_progress=on_progress,
        done=await completed_work(store),
    )
    queue: asyncio.Queue[Keyframe] = asyncio.Queue()
    for keyframe in keyframes:
        queue.put_nowait(keyframe)

    async def worker() -> None:
        while True:
            try:
                keyframe = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await run.frame(keyframe)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, max(queue.qsize(), 1))):
            group.create_task(worker())
    return run.summary
