"""How fast is a video cut, against FFmpeg's own keyframe decode, and how long does a video job take?

Makes a 1080p H.264 minute with PyAV (25 fps, a keyframe every 2 s, a new labelled scene every 5 s), then
prints medians over ``--repeats`` runs of: the cut on the clock only (``scene_threshold`` 0), the cut with
shot changes (FFmpeg's scdet; every frame is decoded either way), ``ffmpeg -skip_frame nokey -i F
-vsync 0 -f null -`` on the same file where an ``ffmpeg`` command is installed, and a video job's end-to-end
time (``POST /v1/jobs`` with the file to ``succeeded``) on a gateway before the instant simulator (no
verdict reused, so every frame is judged).

    python -m bench.video_cut [--repeats 3] [--json docs/bench/video-cut.json]
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from cli.embedded import ThreadedServer
from deploy.keyframes import LABELS
from deploy.simulator import PRESETS, create_sim_app
from deploy.videos import Scene, make_video
from gateway.http.app import create_app
from gateway.jobs.video import likeness
from gateway.moderation.verdict_cache import NearDuplicateRule
from gateway.settings import EngineSettings, Settings, ShapingSettings, VideoSettings
from shaping.video import Sampling, VideoLimits, cut_video

LIMITS = VideoLimits(max_bytes=1 << 30, max_duration_s=3600, max_pixels=1 << 26)


def minute_of_1080p() -> bytes:
    """60 s of 1920x1080 H.264: twelve 5-second scenes of rotating labels."""
    scenes = [Scene(LABELS[i % len(LABELS)], 5, seed=i) for i in range(12)]
    return make_video(scenes, width=1920, height=1080, fps=25, keyframe_every_s=2)


def timed(function: Any, repeats: int) -> tuple[float, Any]:
    """The median wall time of ``function()`` over ``repeats`` runs, and its last answer."""
    times, answer = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        answer = function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


def ffmpeg_keyframes(binary: str, path: Path) -> None:
    """``ffmpeg -skip_frame nokey`` decoding the file's keyframes to nowhere."""
    subprocess.run([binary, "-v", "error", "-skip_frame", "nokey", "-i", str(path), "-vsync", "0",
                    "-f", "null", "-"], check=True)


def job_seconds(video: bytes, repeats: int) -> float:
    """The median time from ``POST /v1/jobs`` to ``succeeded`` on the instant simulator."""
    url = f"data:video/mp4;base64,{base64.b64encode(video).decode()}"
    times = []
    with ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)) as sim:
        settings = Settings(engine=EngineSettings(url=sim.url), videos=VideoSettings(max_bytes=64 << 20),
                            shaping=ShapingSettings(verdict_cache_ttl_s=0, max_body_bytes=128 << 20))
        with ThreadedServer(create_app(settings)) as gateway, httpx.Client(base_url=gateway.url, timeout=60) as c:  # noqa: E501 - one context line
            for run in range(repeats):
                started = time.perf_counter()
                job = c.post("/v1/jobs", json={"video_id": f"bench-{run}", "video": {"url": url}}).json()
                while job["status"] not in ("succeeded", "failed"):
                    time.sleep(0.05)
                    job = c.get(f"/v1/jobs/{job['id']}").json()
                if job["status"] != "succeeded":
                    raise SystemExit(f"the job failed: {job['error']}")
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    made = time.perf_counter()
    video = minute_of_1080p()
    made_s = time.perf_counter() - made
    rows: list[dict[str, Any]] = []
    same = likeness(NearDuplicateRule())
    for name, threshold in (("PyAV cut, the clock only", 0.0), ("PyAV cut, the clock + shot changes", 0.03)):
        sampling = Sampling(scene_threshold=threshold, max_frames=1024)
        seconds, cut = timed(lambda s=sampling: cut_video(video, LIMITS, s, same, budget_s=600), args.repeats)
        rows.append({"what": name, "seconds": round(seconds, 3), "frames_decoded": cut.decoded,
                     "frames_cut": len(cut.frames), "decoded_per_s": round(cut.decoded / seconds, 1)})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "minute.mp4"
        path.write_bytes(video)
        if (binary := shutil.which("ffmpeg")) is not None:
            seconds, _ = timed(lambda: ffmpeg_keyframes(binary, path), args.repeats)
            keyframes = rows[0]["frames_decoded"]
            rows.append({"what": "ffmpeg -skip_frame nokey (Debian's)", "seconds": round(seconds, 3),
                         "frames_decoded": keyframes, "frames_cut": None,
                         "decoded_per_s": round(keyframes / seconds, 1)})
    rows.append({"what": "video job end to end (instant simulator)",
                 "seconds": round(job_seconds(video, args.repeats), 3),
                 "frames_decoded": None, "frames_cut": rows[1]["frames_cut"], "decoded_per_s": None})
    document = {
        "command": "python -m bench.video_cut " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg(),
                    "python": platform.python_version()},
        "video": {"seconds": 60, "size": "1920x1080", "fps": 25, "keyframe_every_s": 2, "codec": "h264",
                  "bytes": len(video), "made_in_s": round(made_s, 1)},
        "repeats": args.repeats,
        "rows": rows,
    }
    for row in rows:
        print(f"{row['what']:<45} {row['seconds']:>8.3f} s  decoded {row['frames_decoded']}  "
              f"cut {row['frames_cut']}  ({row['decoded_per_s']} frames/s)")
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
