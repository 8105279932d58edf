"""What a video job costs the gateway process and Redis: the Redis bytes a job's keys hold while it waits, is
judged and has finished, and the gateway's peak memory while it takes a large multipart upload.

Starts a private ``redis-server``, a simulator whose answers each take ``--slow-s`` (so the job is read while
it is judged) and ``modgate serve`` in a process of its own, then:

1. posts a ``--clip-size`` H.264 clip (allow, a violent middle, allow) as ``multipart/form-data`` and reads
   ``MEMORY USAGE`` of every ``modgate:job:<id>*`` key at once, while the job is judged (its progress
   shown) and once it has finished;
2. posts a ~27 MiB video (random pixels, so it does not compress; 30 s, over the 20 s duration limit the
   gateway is given, so it is refused at the probe and never cut) and reads the process's peak resident
   memory (``VmHWM``) before and after.

    python -m bench.video_upload [--label NAME] [--json docs/bench/video-upload.json]

With ``--json``, the run is added to the file under its label (a run of an older gateway, measured with this
same script from that commit's tree, stays beside it).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from bench.cluster import RedisProcess
from bench.servers import gateway_process
from cli.embedded import ThreadedServer
from deploy.simulator import PRESETS, Faults, create_sim_app
from deploy.videos import Scene, make_video

FINISHED = ("succeeded", "failed")
CLIP = [Scene("allow", 3, seed=1), Scene("block:violence", 3, seed=2), Scene("allow", 3, seed=3)]
MAX_DURATION_S = 20  # the gateway's duration limit here: the large upload lasts longer, and is not cut


def noise_video(seconds: int = 30, width: int = 1280, height: int = 720) -> bytes:
    """``seconds`` frames of random pixels at 1 fps in H.264: about 1.3 MB a frame, as a camera's worst."""
    import av

    buffer = io.BytesIO()
    pixels = np.random.default_rng(7)
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=1)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "20", "preset": "ultrafast"}
        for _ in range(seconds):
            frame = av.VideoFrame.from_ndarray(pixels.integers(0, 256, (height, width, 3), np.uint8), "rgb24")
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))
    return buffer.getvalue()


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc status")


def footprint(state: redis.Redis, job_id: str) -> dict[str, int]:
    """Each of the job's keys (its suffix after the job's hash) and the bytes Redis holds for it."""
    key = f"modgate:job:{job_id}"
    return {name.decode().removeprefix(key) or "(hash)": int(state.memory_usage(name) or 0)
            for name in state.scan_iter(f"{key}*")}


def multipart(name: str, video: bytes, video_id: str) -> dict[str, Any]:
    """A multipart job's parts."""
    fields = json.dumps({"video_id": video_id})
    return {"video": (name, video, "video/mp4"), "job": (None, fields, "application/json")}


def upload_peak(client: httpx.Client, pid: int, large: bytes) -> dict[str, Any]:
    """The gateway's peak resident memory before and after it takes ``large`` (refused at the probe)."""
    client.get(f"/v1/jobs/job_{'0' * 32}")  # one request served: the process as it runs
    before = peak_rss(pid)
    refused = client.post("/v1/jobs", files=multipart("large.mp4", large, "large"))
    after = peak_rss(pid)
    return {"bytes": len(large), "status": refused.status_code,
            "code": refused.json().get("error", {}).get("code"),
            "peak_rss_before": before, "peak_rss_after": after, "peak_rss_added": after - before}


def job_when(client: httpx.Client, job_id: str, ready: Any, what: str) -> dict[str, Any]:
    """Poll the job until ``ready(job)``; a finished job that is not ready is an error."""
    deadline = time.monotonic() + 120
    while not ready(job := client.get(f"/v1/jobs/{job_id}").json()):
        if time.monotonic() > deadline or job["status"] in FINISHED:
            raise RuntimeError(f"the clip's job was not seen {what}: {job}")
        time.sleep(0.2)
    return dict(job)


def clip_footprint(client: httpx.Client, state: redis.Redis, clip: bytes) -> dict[str, Any]:
    """The Redis bytes of the clip's job: at once, while it is judged, once finished."""
    job_id = client.post("/v1/jobs", files=multipart("clip.mp4", clip, "clip")).json()["id"]
    at_once = footprint(state, job_id)
    job_when(client, job_id, lambda job: job.get("progress"), "being judged")
    judged = footprint(state, job_id)
    job = job_when(client, job_id, lambda job: job["status"] in FINISHED, "finished")
    return {"bytes": len(clip), "status": job["status"],
            "frames_sent": job["result"]["coverage"]["sent"] if job.get("result") else None,
            "redis_at_submission": at_once, "redis_while_judged": judged,
            "redis_finished": footprint(state, job_id)}


def measure(clip: bytes, large: bytes, slow_s: float) -> dict[str, Any]:
    """Both measurements on a fresh Redis, simulator and gateway."""
    with tempfile.TemporaryDirectory() as folder:
        store = RedisProcess(Path(folder) / "redis").start()
        faults = Faults(slow_rate=1.0, slow_s=slow_s)
        sim = ThreadedServer(create_sim_app(PRESETS["instant"], 0.0, faults)).start()
        env = {"MODGATE_REDIS__URL": store.url, "MODGATE_VIDEOS__MAX_DURATION_S": str(MAX_DURATION_S),
               "MODGATE_VIDEOS__SPOOL_DIR": str(Path(folder) / "spool")}
        state = redis.Redis.from_url(store.url)
        try:
            with gateway_process(sim.url, **env) as (url, pid), httpx.Client(base_url=url, timeout=300) as gw:
                peak = upload_peak(gw, pid, large)
                return {"large_upload": peak, "clip_job": clip_footprint(gw, state, clip)}
        finally:
            state.close()
            sim.stop()
            store.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--slow-s", type=float, default=2.0, help="each engine answer's delay")
    parser.add_argument("--json", type=Path, help="add the run to this file")
    args = parser.parse_args()
    clip = make_video(CLIP, width=1280, height=720, fps=25)
    large = noise_video()
    run = {
        "command": shlex.join(["python", "-m", "bench.video_upload", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_before": os.getloadavg(),
                    "python": platform.python_version()},
        **measure(clip, large, args.slow_s),
    }
    upload, job = run["large_upload"], run["clip_job"]
    mib = 1 << 20
    print(f"large upload {upload['bytes'] / mib:.1f} MiB: {upload['status']} {upload['code']}; peak RSS "
          f"{upload['peak_rss_before'] / mib:.1f} -> {upload['peak_rss_after'] / mib:.1f} MiB "
          f"(+{upload['peak_rss_added'] / mib:.1f})")
    for moment in ("redis_at_submission", "redis_while_judged", "redis_finished"):
        held = job[moment]
        print(f"clip {job['bytes'] / mib:.1f} MiB, {moment}: {sum(held.values()):,} bytes {held}")
    if args.json:
        runs = json.loads(args.json.read_text()) if args.json.exists() else {}
        runs[args.label] = run
        args.json.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
