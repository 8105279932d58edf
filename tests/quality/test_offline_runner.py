"""The offline A/B runner against a fake gateway (httpx.MockTransport answering the gateway's shape)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections import Counter
from pathlib import Path

import httpx
import pytest
from PIL import Image

from contracts.records import JsonlRecordStore, pair_records
from quality.runner import (
    DatasetError,
    ProgressEvent,
    load_dataset,
    load_labels,
    parse_arms,
    run_offline,
)
from tests.quality.fakes import FakeGateway

NO_WAIT = (0.0, 0.0, 0.0)


def write_image(path: Path, seed: int) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    kind = {".png": "PNG", ".webp": "WEBP"}.get(path.suffix, "JPEG")
    Image.new("RGB", (32, 18), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256)).save(buffer, kind)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


@pytest.fixture
def frames_folder(tmp_path: Path) -> Path:
    root = tmp_path / "frames"
    for video in range(3):
        for frame in range(4):
            write_image(root / f"video-{video}" / f"{frame:03d}.jpg", seed=video * 10 + frame)
    write_image(root / "loose.png", seed=99)
    (root / "notes.txt").write_text("not an image")
    return root


def client_for(gateway: FakeGateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=gateway.transport(), base_url="http://gateway.test")


# --- datasets --------------------------------------------------------------------------------------------


def test_a_folder_dataset_takes_each_frames_video_from_its_subfolder(frames_folder: Path) -> None:
    frames = load_dataset(frames_folder)
    assert len(frames) == 13
    assert Counter(f.video_id for f in frames) == {"video-0": 4, "video-1": 4, "video-2": 4, None: 1}
    assert frames[-1].key == "video-2/003.jpg"


def test_a_csv_manifest_names_paths_videos_and_labels(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 1)
    write_image(tmp_path / "b.webp", 2)
    (tmp_path / "frames.csv").write_text("path,video_id,label\na.jpg,v1,block\nb.webp,v1,\n")
    frames = load_dataset(tmp_path / "frames.csv")
    assert [(f.key, f.video_id) for f in frames] == [("a.jpg", "v1"), ("b.webp", "v1")]
    assert frames[0].label is not None
    assert frames[0].label.flagged
    assert frames[1].label is None


def test_a_jsonl_manifest_takes_flagged_zero_or_one(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 1)
    (tmp_path / "frames.jsonl").write_text(json.dumps({"path": "a.jpg", "flagged": 0}) + "\n")
    [frame] = load_dataset(tmp_path / "frames.jsonl")
    assert frame.label is not None
    assert frame.label.flagged is False


def test_a_manifest_listing_missing_images_says_which(tmp_path: Path) -> None:
    (tmp_path / "frames.csv").write_text("path\nnowhere.jpg\n")
    with pytest.raises(DatasetError, match=r"1 listed images do not exist: nowhere\.jpg"):
        load_dataset(tmp_path / "frames.csv")


def test_a_folder_without_images_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no \.jpg"):
        load_dataset(tmp_path)


def test_an_unknown_label_is_refused(tmp_path: Path) -> None:
    (tmp_path / "labels.csv").write_text("path,label\na.jpg,maybe\n")
    with pytest.raises(DatasetError, match="allow, review or block"):
        load_labels(tmp_path / "labels.csv")


def test_arms_parse_and_unknown_arms_are_refused() -> None:
    assert parse_arms("thinking_on, thinking_off,thinking_on") == ["thinking_on", "thinking_off"]
    with pytest.raises(DatasetError, match="unknown arm"):
        parse_arms("thinking_on,fast")


# --- runs ------------------------------------------------------------------------------------------------


async def test_every_frame_goes_through_every_arm_and_pairs_up(frames_folder: Path, tmp_path: Path) -> None:
    gateway = FakeGateway(flag_rate=0.3, flip_rate=0.2)
    store = JsonlRecordStore(tmp_path / "records")
    events: list[ProgressEvent] = []
    async with client_for(gateway) as client:
        summary = await run_offline(
            load_dataset(frames_folder),
            ["thinking_on", "thinking_off"],
            client=client,
            store=store,
            model="modgate-moderation",
            concurrency=3,
            on_progress=events.append,
        )
    records = await store.read_range(None, None)
    await store.aclose()
    assert summary.sent == {"thinking_on": 13, "thinking_off": 13}
    assert len(events) == 26
    assert Counter((c["thinking"], c["model"]) for c in gateway.calls) == {
        ("on", "modgate-moderation"): 13,
        ("off", "modgate-moderation"): 13,
    }
    assert {c["video"] for c in gateway.calls} == {"video-0", "video-1", "video-2", None}
    pairing = pair_records(records)
    assert len(pairing.pairs) == 13
    on = next(r for r in records if r.arm == "thinking_on")
    assert (on.source, on.prompt_tokens, on.completion_tokens, on.latency_ms) == ("offline", 1076, 95, 8560.0)
    assert on.categories == (["violence"] if on.flagged else [])
    assert on.input_sha256 == on.frame_sha256  # the fake hashes the bytes it was sent


async def test_an_interrupted_run_continues_where_it_stopped(frames_folder: Path, tmp_path: Path) -> None:
    keyframes = load_dataset(frames_folder)
    stalled = FakeGateway(stall_after=9, stall_waiters=2)
    store = JsonlRecordStore(tmp_path / "records")
    async with client_for(stalled) as client:
        task = asyncio.create_task(
            run_offline(keyframes, ["thinking_on", "thinking_off"], client=client, store=store, concurrency=2)
        )
        # Both workers hang on their next call, so all 9 answered verdicts are written: Ctrl-C now.
        await stalled.stalled.wait()
        task.cancel()  # what Ctrl-C does to the running loop
        with pytest.raises(asyncio.CancelledError):
            await task
    await store.aclose()
    first_pass = await JsonlRecordStore(tmp_path / "records").read_range(None, None)
    assert len(first_pass) == 9

    healthy = FakeGateway()
    resumed = JsonlRecordStore(tmp_path / "records")
    async with client_for(healthy) as client:
        summary = await run_offline(keyframes, ["thinking_on", "thinking_off"], client=client, store=resumed)
    records = await resumed.read_range(None, None)
    await resumed.aclose()
    assert len(healthy.calls) == 26 - 9
    assert sum(summary.skipped.values()) == 9
    assert Counter((r.frame_sha256, r.arm) for r in records).most_common(1)[0][1] == 1
    assert len(pair_records(records).pairs) == 13


async def test_busy_and_failing_frames_are_retried_then_counted(frames_folder: Path, tmp_path: Path) -> None:
    keyframes = load_dataset(frames_folder)[:3]
    shas = [hashlib.sha256(f.path.read_bytes()).hexdigest() for f in keyframes]
    gateway = FakeGateway(fail_first={shas[0]: 2, shas[1]: 50})
    store = JsonlRecordStore(tmp_path / "records")
    async with client_for(gateway) as client:
        summary = await run_offline(
            keyframes, ["thinking_on"], client=client, store=store, retry_delays=NO_WAIT
        )
    await store.aclose()
    assert summary.sent["thinking_on"] == 2  # the first recovered after two 503s
    assert summary.failed["thinking_on"] == 1
    assert "503 upstream_error: engine unavailable" in summary.errors[0]


async def test_a_rerun_bypasses_the_gateways_verdict_cache(frames_folder: Path, tmp_path: Path) -> None:
    gateway = FakeGateway()
    store = JsonlRecordStore(tmp_path / "records")
    async with client_for(gateway) as client:
        await run_offline(
            load_dataset(frames_folder)[:4],
            ["thinking_on", "thinking_on_rerun"],
            client=client,
            store=store,
        )
    records = await store.read_range(None, None)
    await store.aclose()
    reruns = [r for r in records if r.arm == "thinking_on_rerun"]
    assert len(reruns) == 4
    assert not any(r.reused for r in reruns)
    assert {c["cache"] for c in gateway.calls if c["thinking"] == "on"} == {None, "no-cache"}


async def test_human_labels_join_by_path_or_by_hash(frames_folder: Path, tmp_path: Path) -> None:
    keyframes = load_dataset(frames_folder)[:3]
    by_hash = hashlib.sha256(keyframes[1].path.read_bytes()).hexdigest()
    (tmp_path / "labels.csv").write_text(
        f"path,frame_sha256,label\n{keyframes[0].key},,block\n,{by_hash},allow\n"
    )
    store = JsonlRecordStore(tmp_path / "records")
    async with client_for(FakeGateway()) as client:
        summary = await run_offline(
            keyframes,
            ["thinking_on"],
            client=client,
            store=store,
            labels=load_labels(tmp_path / "labels.csv"),
        )
    records = {r.input_sha256: r for r in await store.read_range(None, None)}
    await store.aclose()
    assert summary.labelled == 2
    first = records[hashlib.sha256(keyframes[0].path.read_bytes()).hexdigest()]
    assert first.human_label is not None
    assert (first.human_label.flagged, first.human_label.action) == (True, "block")
    assert records[by_hash].human_label is not None
    assert records[by_hash].human_label.flagged is False


async def test_a_gateway_that_ignores_the_requested_arm_is_reported(
    frames_folder: Path, tmp_path: Path
) -> None:
    fake = FakeGateway()

    async def always_on(request: httpx.Request) -> httpx.Response:
        response = await fake.handle(request)
        body = json.loads(response.content)
        body["results"][0]["modgate"]["thinking"] = "on"  # a policy that forces thinking on
        return httpx.Response(200, json=body)

    store = JsonlRecordStore(tmp_path / "records")
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(always_on), base_url="http://gateway.test"
    ) as client:
        summary = await run_offline(
            load_dataset(frames_folder)[:2], ["thinking_off"], client=client, store=store
        )
    await store.aclose()
    assert summary.failed["thinking_off"] == 2
    assert "asked for thinking off, the gateway ran thinking on" in summary.errors[0]
