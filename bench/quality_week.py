"""A synthetic week of verdict records at fleet scale, generated column by column (no record objects).

Every kind of record the weekly report meets is in it: both thinking modes as random shadow pairs (with
the fast verdict's confidence), escalation pairs (weighted by their selection probability), thinking-on
re-runs (some answered from the verdict cache), the JSON verdict arms, a second engine's verdicts on some
frames, duplicates, frames without a video, human labels on a few, two policy versions, three sources of
timing, and records just outside the week. Timestamps have whole seconds, so many records tie and the
order of the file decides, as it does in real weeks.

`week_table` builds a pyarrow table in the Parquet schema of :mod:`quality.columnar`; `write_jsonl`
writes the same records as the gateway's JSONL files (what today's stores hold), `write_parquet` as the
week's Parquet partition.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from contracts.records import VerdictRecord, week_bounds
from quality.columnar import RECORD_SCHEMA, write_week_partition

CATEGORIES = ("sexual", "violence", "self-harm", "hate", "illicit", "sexual/minors")
TENANTS = ("acme", "globex", "initech", "umbrella")


def _hex_ids(prefix: str, count: int, seed: int) -> np.ndarray:
    """`count` distinct 64-hex-digit ids: a hash of the seed, then the index in the last 16 digits."""
    head = hashlib.sha256(f"{prefix}-{seed}".encode()).hexdigest()[:48]
    return np.char.add(head, np.char.zfill(np.char.mod("%x", np.arange(count)), 16)).astype(object)


def week_table(
    pairs: int,
    *,
    year: int = 2026,
    week: int = 48,
    frames_per_video: int = 20,
    flag_rate: float = 0.08,
    miss_on_flagged: float = 0.08,
    flag_on_safe: float = 0.02,
    renamed: float = 0.1,
    second_engine: float = 0.0,
    seed: int = 48,
    video_prefix: str = "video-",
) -> pa.Table:
    """About `pairs` random thinking on/off pairs and everything around them, as one arrow table."""
    rng = np.random.default_rng(seed)
    n = pairs
    start, _ = week_bounds(year, week)
    base = int(start.timestamp()) * 1_000_000
    videos = max(1, n // frames_per_video)
    video = rng.integers(0, videos, size=n)
    no_video = rng.random(n) < 0.01
    video_flag = rng.beta(flag_rate * 8, (1 - flag_rate) * 8, size=videos)
    on_flagged = rng.random(n) < video_flag[video]
    flip = np.where(on_flagged, rng.random(n) < miss_on_flagged, rng.random(n) < flag_on_safe)
    off_flagged = on_flagged ^ flip
    review = rng.random(n) < 0.1
    cat_a = rng.integers(0, len(CATEGORIES) - 1, size=n)
    cat_b = rng.integers(0, len(CATEGORIES), size=n)
    two_categories = rng.random(n) < 0.2
    other_category = rng.random(n) < renamed  # thinking off names another category for a flagged frame
    # the fast verdict's confidence: lower where it disagrees
    confidence = np.clip(np.where(flip, rng.beta(4, 3, n), rng.beta(12, 1.2, n)), 0, 1)
    escalated = (confidence < 0.6) & (rng.random(n) < 0.5)
    seconds = rng.integers(0, 7 * 86400 - 120, size=n)
    outside = rng.random(n) < 0.002
    frame = _hex_ids("frame", n, seed)
    video_ids = np.char.add(video_prefix, np.char.zfill(video.astype(str), 6)).astype(object)
    video_ids[no_video] = None
    tenants = np.asarray(TENANTS, dtype=object)[(video % len(TENANTS))]

    columns: dict[str, list[np.ndarray]] = {name: [] for name in RECORD_SCHEMA.names}

    def emit(rows: np.ndarray, arm: str, flagged: np.ndarray, delay: int, *, engine: str = "vllm") -> None:
        count = rows.size
        thinking = "on" in arm
        action = np.where(flagged, np.where(review[rows], "review", "block"), "allow").astype(object)
        first = np.asarray(CATEGORIES, dtype=object)[cat_a[rows]]
        second = np.asarray(CATEGORIES, dtype=object)[cat_b[rows]]
        if not thinking:
            first = np.where(other_category[rows], second, first)
        categories = [
            ([a, b] if two and a != b else [a]) if f else []
            for a, b, two, f in zip(first, second, two_categories[rows], flagged, strict=True)
        ]
        moment = base + (seconds[rows] + delay + np.where(outside[rows], 7 * 86400, 0)) * 1_000_000
        columns["frame_sha256"].append(frame[rows])
        columns["video_id"].append(video_ids[rows])
        columns["tenant"].append(tenants[rows])
        columns["arm"].append(np.full(count, arm, dtype=object))
        columns["action"].append(action)
        columns["flagged"].append(flagged)
        columns["categories"].append(np.asarray([*categories, None], dtype=object)[:-1])
        columns["policy_version"].append(np.where(rows % 10 == 0, 4, 3))
        columns["prompt_tokens"].append(np.full(count, 1076))
        columns["cached_tokens"].append(np.where(rng.random(count) < 0.7, 416, 0))
        completion = rng.integers(80, 120, count) if thinking else rng.integers(4, 8, count)
        columns["completion_tokens"].append(completion)
        columns["reasoning_tokens"].append(completion - 5 if thinking else np.zeros(count, dtype=np.int64))
        latency = rng.lognormal(np.log(8560 if thinking else 620), 0.2, count)
        columns["latency_ms"].append(np.round(latency, 3))
        ttft = np.round(rng.lognormal(np.log(468), 0.2, count), 3).astype(object)
        ttft[rng.random(count) < 0.05] = None
        columns["ttft_ms"].append(ttft)
        columns["recorded_at"].append(moment)
        columns["source"].append(np.where(rows % 7 == 0, "offline", "shadow").astype(object))
        columns["request_id"].append(np.char.add(f"req-{arm}-", rows.astype(str)).astype(object))
        columns["reused"].append(rng.random(count) < (0.1 if arm == "thinking_on_rerun" else 0.01))
        columns["input_sha256"].append(np.full(count, None, dtype=object))
        labelled = rows % 50 == 0
        label = [
            {"flagged": bool(f), "action": "block" if f else "allow"} if lab else None
            for f, lab in zip(on_flagged[rows], labelled, strict=True)
        ]
        columns["human_label"].append(np.asarray([*label, None], dtype=object)[:-1])
        fast = arm == "thinking_off"
        columns["confidence"].append(
            np.where(fast, np.round(confidence[rows], 6), np.nan).astype(object)
            if fast
            else np.full(count, None, dtype=object)
        )
        selection = np.where(escalated[rows], "escalation", "random").astype(object)
        probability = np.where(escalated[rows], 1.0, 0.05).astype(object)
        if arm not in ("thinking_on", "thinking_off"):
            selection = np.full(count, None, dtype=object)
            probability = np.full(count, None, dtype=object)
        columns["selection"].append(selection)
        columns["selection_probability"].append(probability)
        columns["engine"].append(np.full(count, engine, dtype=object))

    every = np.arange(n)
    emit(every, "thinking_on", on_flagged, 0)
    emit(every, "thinking_off", off_flagged, 9)
    rerun = every[rng.random(n) < 0.1]
    emit(rerun, "thinking_on_rerun", on_flagged[rerun] ^ (rng.random(rerun.size) < 0.01), 20)
    formats = every[rng.random(n) < 0.05]
    emit(formats, "thinking_off_json", off_flagged[formats] ^ (rng.random(formats.size) < 0.01), 30)
    emit(formats, "thinking_on_json", on_flagged[formats], 40)
    duplicate = every[rng.random(n) < 0.01]
    emit(duplicate, "thinking_off", ~off_flagged[duplicate], 3600)
    if second_engine > 0:
        other = every[rng.random(n) < second_engine]
        emit(
            other, "thinking_off", off_flagged[other] ^ (rng.random(other.size) < 0.03), 60, engine="llamacpp"
        )
    arrays = []
    for name in RECORD_SCHEMA.names:
        values = np.concatenate(columns[name])
        field = RECORD_SCHEMA.field(name)
        if name == "recorded_at":
            arrays.append(pa.array(values, type=pa.int64()).cast(field.type))
        elif name == "confidence":
            arrays.append(pa.array([None if v is None or v != v else v for v in values], type=field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def write_jsonl(table: pa.Table, path: Path, *, batch: int = 50_000) -> int:
    """The table as the gateway's JSONL record file (one record a line, in table order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = 0
    with path.open("w", encoding="utf-8") as out:
        for chunk in table.to_batches(batch):
            for row in chunk.to_pylist():
                row["recorded_at"] = row["recorded_at"].isoformat().replace("+00:00", "Z")
                row = {k: v for k, v in row.items() if k in VerdictRecord.model_fields}
                out.write(json.dumps(row, separators=(",", ":")) + "\n")
                lines += 1
    return lines


def write_parquet(table: pa.Table, directory: Path) -> list[Path]:
    """The table as Parquet partitions by ISO week under `directory`."""
    return write_week_partition(table, directory)


def shift(table: pa.Table, days: int) -> pa.Table:
    """The same records `days` later (an earlier or later week for trends)."""
    column = table.column("recorded_at")
    moved = pa.array(
        column.cast(pa.int64()).to_numpy() + int(timedelta(days=days).total_seconds() * 1_000_000),
        pa.int64(),
    ).cast(column.type)
    return table.set_column(table.schema.get_field_index("recorded_at"), "recorded_at", moved)
