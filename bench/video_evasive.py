"""Can an uploader hide a harmful second in how a video is encoded? The cut against today's keyframes-only.

Makes the evasive corpus (deploy/evasive_videos.py: long GOP without scene-cut keyframes, hard cuts,
cross-fades, a 1-second flash, variable frame rate, live Matroska without a duration, a mid-stream size
change, rotation metadata; each video's harmful time known) and cuts each twice: with the gateway's cut at
its defaults (shaping/video: every frame decoded, a covered frame every ``MAX_GAP_S``, shot changes from
scdet, look-alikes reusing a verdict) and with the cut the gateway had before (the stream's keyframes only,
FFmpeg's ``skip_frame`` NONKEY). Each judged frame's verdict is its label read back as the engine simulator
reads it; a moment of harmful time is caught when the covered frame at or before it is blocked. Prints per
video and in total: harmful seconds caught, frames sent to the engine, frames decoded and cut time.

With ``--long`` it also makes a 10-minute 1080p H.264 video (one minute encoded, its packets repeated) and
times the cut at defaults against Debian's ``ffmpeg`` doing the same selection (decode every frame, a scene
score, a frame a second or at a shot change, each picked frame written as a JPEG): run it once, on a quiet
machine if there is one; the load is written beside the figures. A later run without ``--long`` keeps the
10-minute figures of the JSON it overwrites, with the command, date and machine of their run.

    python -m bench.video_evasive [--long] [--json docs/bench/video-evasive.json]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from PIL import Image

from deploy.evasive_videos import EvasiveVideo, corpus, encode, held
from deploy.keyframes import LABELS, read_label, render_keyframe
from gateway.jobs.video import likeness
from gateway.moderation.verdict_cache import NearDuplicateRule
from gateway.settings import VideoSettings
from shaping.video import Sampling, VideoLimits, cut_video
from shaping.video.probe import open_container, video_stream

DEFAULTS = VideoSettings()
LIMITS = VideoLimits(max_bytes=DEFAULTS.max_bytes, max_duration_s=DEFAULTS.max_duration_s,
                     max_pixels=DEFAULTS.max_pixels,
                     max_decoded_frames=int(DEFAULTS.max_duration_s * DEFAULTS.max_decoded_fps))
STEP_MS = 100  # harmful time is checked every 100 ms


def blocked(image: Image.Image) -> bool:
    """The simulator's verdict on a frame: blocked when its marker squares carry a block label."""
    return read_label(image).action == "block"


def caught_ms(video: EvasiveVideo, verdicts: list[tuple[int, bool]]) -> tuple[int, int]:
    """(harmful ms caught, harmful ms) given each covered frame's (timestamp, blocked), in time order."""
    caught = total = 0
    for start, end in video.harmful:
        for moment in range(start, end, STEP_MS):
            total += STEP_MS
            before = [is_blocked for at, is_blocked in verdicts if at <= moment]
            caught += STEP_MS if before and before[-1] else 0
    return caught, total


def new_cut(video: EvasiveVideo) -> dict[str, Any]:
    """The gateway's cut at its defaults."""
    sampling = Sampling(max_gap_s=DEFAULTS.max_gap_s, scene_threshold=DEFAULTS.scene_threshold,
                        max_fps=DEFAULTS.max_fps, max_frames=64)
    started = time.perf_counter()
    same = likeness(NearDuplicateRule())
    cut = cut_video(video.data, LIMITS, sampling, same, budget_s=DEFAULTS.cut_budget_s)
    seconds = time.perf_counter() - started
    judged = [blocked(Image.open(io.BytesIO(frame.jpeg))) for frame in cut.frames]
    caught, total = caught_ms(video, [(c.timestamp_ms, judged[c.judged]) for c in cut.covered])
    return {"caught_s": caught / 1000, "harmful_s": total / 1000, "engine_frames": len(cut.frames),
            "frames_decoded": cut.decoded, "cut_s": round(seconds, 3), "max_gap_ms": cut.coverage.max_gap_ms}


def keyframes_cut(video: EvasiveVideo) -> dict[str, Any]:
    """The cut the gateway had before: the stream's keyframes only (the codec skips every other frame)."""
    started = time.perf_counter()
    verdicts: list[tuple[int, bool]] = []
    decoded = 0
    with open_container(video.data) as container:
        stream = video_stream(container)
        stream.codec_context.skip_frame = "NONKEY"
        start = stream.start_time or 0
        time_base = Fraction(stream.time_base) if stream.time_base is not None else Fraction(1, 1000)
        for frame in container.decode(stream):
            decoded += 1
            if frame.pts is not None:
                at = int((frame.pts - start) * time_base * 1000)
                verdicts.append((at, blocked(frame.to_image())))  # type: ignore[no-untyped-call]  # PyAV's stub leaves it untyped
    seconds = time.perf_counter() - started
    caught, total = caught_ms(video, verdicts)
    return {"caught_s": caught / 1000, "harmful_s": total / 1000, "engine_frames": len(verdicts),
            "frames_decoded": decoded, "cut_s": round(seconds, 3)}


def ten_minutes_of_1080p(folder: Path) -> Path:
    """10 minutes of 1920x1080 H.264 at 25 fps: one minute of six 10-second scenes, its packets repeated."""
    import av

    scenes = []
    for number in range(6):
        picture = render_keyframe(LABELS[number % len(LABELS)], 1920, 1080, seed=number)
        scenes += held(picture, number * 10_000, 10, 25)
    minute = folder / "minute.mp4"
    fast = {"preset": "veryfast", "crf": "23"}
    minute.write_bytes(encode(scenes, size=(1920, 1080), gop=250, options=fast))
    long = folder / "ten-minutes.mp4"
    with av.open(str(minute)) as source, av.open(str(long), "w") as output:
        stream = source.streams.video[0]
        copy = output.add_stream_from_template(stream)
        packets = [packet for packet in source.demux(stream) if packet.dts is not None]
        assert stream.time_base is not None
        minute_ticks = int(60 / stream.time_base)
        for loop in range(10):
            for packet in packets:
                packet.stream = copy
                packet.pts = None if packet.pts is None else packet.pts + (minute_ticks if loop else 0)
                packet.dts = None if packet.dts is None else packet.dts + (minute_ticks if loop else 0)
                output.mux(packet)
    return long


def long_case() -> dict[str, Any]:
    """The 10-minute cut at defaults against ``ffmpeg`` making the same selection."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        made = time.perf_counter()
        path = ten_minutes_of_1080p(folder)
        made_s = time.perf_counter() - made
        data = path.read_bytes()
        started = time.perf_counter()
        cut = cut_video(data, LIMITS, Sampling(max_gap_s=DEFAULTS.max_gap_s,
                                               scene_threshold=DEFAULTS.scene_threshold),
                        likeness(NearDuplicateRule()), budget_s=DEFAULTS.cut_budget_s)
        cut_s = time.perf_counter() - started
        row: dict[str, Any] = {
            "video": {"seconds": 600, "size": "1920x1080", "fps": 25, "bytes": len(data),
                      "made_in_s": round(made_s, 1)},
            "cut_s": round(cut_s, 1), "frames_decoded": cut.decoded, "covered": cut.coverage.candidates,
            "engine_frames": len(cut.frames), "max_gap_ms": cut.coverage.max_gap_ms,
            "budget_s": DEFAULTS.cut_budget_s,
        }
        binary = shutil.which("ffmpeg")
        if binary is None:
            return row | {"ffmpeg": "not installed"}
        out = folder / "frames"
        out.mkdir()
        select = (f"select='isnan(prev_selected_t)+gte(t-prev_selected_t\\,{DEFAULTS.max_gap_s:g})"
                  f"+gt(scene\\,{DEFAULTS.scene_threshold:g})'")
        command = [binary, "-v", "error", "-i", str(path), "-vf", select, "-fps_mode", "vfr", "-q:v", "2",
                   str(out / "%05d.jpg")]
        started = time.perf_counter()
        subprocess.run(command, check=True)
        ffmpeg_s = time.perf_counter() - started
        version = subprocess.run([binary, "-version"], capture_output=True, text=True).stdout.split("\n")[0]
        return row | {"ffmpeg_s": round(ffmpeg_s, 1), "ffmpeg_frames": len(list(out.iterdir())),
                      "ffmpeg_command": " ".join(["ffmpeg", *command[1:4], "F", *command[5:-1], "D/N.jpg"]),
                      "ffmpeg_version": version, "ratio": round(cut_s / ffmpeg_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="also the 10-minute 1080p cut against ffmpeg")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for video in corpus():
        rows.append({"video": video.name, "bytes": len(video.data), "cut": new_cut(video),
                     "keyframes_only": keyframes_cut(video)})
    print(f"{'video':<36} {'caught (new)':>13} {'caught (keyframes)':>19} {'engine frames':>14} "
          f"{'decoded':>9} {'cut s':>12}")
    for row in rows:
        new, old = row["cut"], row["keyframes_only"]
        print(f"{row['video']:<36} {new['caught_s']:>5.1f}/{new['harmful_s']:<4.1f} s "
              f"{old['caught_s']:>9.1f}/{old['harmful_s']:<4.1f} s   "
              f"{new['engine_frames']:>5} vs {old['engine_frames']:<4}"
              f"{new['frames_decoded']:>5} vs {old['frames_decoded']:<4}"
              f"{new['cut_s']:>6.2f} vs {old['cut_s']:.2f}")
    total = {key: {field: round(sum(row[key][field] for row in rows), 3)
                   for field in ("caught_s", "harmful_s", "engine_frames", "frames_decoded", "cut_s")}
             for key in ("cut", "keyframes_only")}
    for key, figures in total.items():
        print(f"total, {key}: {figures['caught_s']:.1f} of {figures['harmful_s']:.1f} harmful s caught "
              f"({figures['caught_s'] / figures['harmful_s']:.0%}), "
              f"{figures['engine_frames']} engine frames, "
              f"{figures['frames_decoded']} decoded, {figures['cut_s']:.2f} s cutting")
    document: dict[str, Any] = {
        "command": "python -m bench.video_evasive " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_before": load_before,
                    "python": platform.python_version()},
        "rows": rows, "total": total,
    }
    if args.long:
        document["ten_minutes"] = long_case()
        document["machine"]["load_after"] = os.getloadavg()
        print(json.dumps(document["ten_minutes"], indent=2))
    elif args.json and args.json.exists() and "ten_minutes" in (earlier := json.loads(args.json.read_text())):
        # the long case is run once: a later run of the corpus keeps it, with the run that measured it
        run = earlier.get("ten_minutes_run") or {key: earlier[key] for key in ("command", "date", "machine")}
        document |= {"ten_minutes": earlier["ten_minutes"], "ten_minutes_run": run}
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
