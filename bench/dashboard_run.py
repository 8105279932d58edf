"""Drive a real gateway through a few minutes of traffic, scraped by a real Prometheus that also evaluates
deploy/monitoring/modgate-rules.yaml, then render the dashboard's panels from those series.

    python -m bench.dashboard_run --out docs/dashboard.png

Processes (each on a free port, all stopped at the end): a private redis-server, the simulator (the Spark
preset at ``--time-scale``, default 0.1: ten times the Spark's pace), the gateway, and Debian's
``/usr/bin/prometheus`` (2 s scrapes, 5 s rule evaluation). Phases: steady traffic from three tenants (one
over its quota), a burst past the queue (429s), engine errors, escalate mode, thinking off. It prints the
alerts Prometheus had pending or firing at the end of each phase and the machine's load.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.servers import free_port, gateway, process, simulator, stop
from deploy.keyframes import make_keyframe
from deploy.monitoring.prometheusrule import DASHBOARD, RULES
from deploy.monitoring.render import render
from deploy.videos import Scene, make_video

ADMIN = "dashboard-run-admin-token-0123456789"
TENANTS = {"key-acme": "acme", "key-globex": "globex", "key-initech": "initech"}
SHARES = (("key-acme", 0.5), ("key-globex", 0.3), ("key-initech", 0.2))
LABELS = ("allow", "allow", "block:violence", "allow", "block:sexual")


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of our own (no persistence, loopback), so the run never touches a shared Redis."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is missing: apt-get install -y redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(proc)


@contextlib.contextmanager
def prometheus(target: str, workdir: Path) -> Iterator[str]:
    """Debian's Prometheus scraping ``target`` (host:port) as job "modgate", with modgate's rules."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is missing: apt-get install -y prometheus")
    shutil.copy(RULES, workdir / RULES.name)
    config = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "5s"},
        "rule_files": [RULES.name],
        "scrape_configs": [{"job_name": "modgate", "static_configs": [{"targets": [target]}]}],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    args = [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    with process(args, f"http://127.0.0.1:{port}/-/ready"):
        yield f"http://127.0.0.1:{port}"


class Traffic:
    """Worker threads posting keyframes until told to stop; how many is changed between phases."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.wanted = 0
        self.done = threading.Event()
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        labels = [random.Random(seed).choice(LABELS) for seed in range(300)]
        self.frames = [make_keyframe(label, 640, 360, seed) for seed, label in enumerate(labels)]

    def workers(self, count: int) -> None:
        """Keep ``count`` workers posting."""
        self.wanted = count
        while len(self.threads) < count:
            thread = threading.Thread(target=self._work, args=(len(self.threads),), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _work(self, index: int) -> None:
        chooser = random.Random(index)
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self.done.is_set():
                if index >= self.wanted:
                    time.sleep(0.2)
                    continue
                key = chooser.choices([k for k, _ in SHARES], [w for _, w in SHARES])[0]
                frame = chooser.choice(self.frames)
                part = {"type": "image_url", "image_url": {"url": _data_url(frame)}}
                with contextlib.suppress(httpx.HTTPError):
                    status = http.post("/v1/moderations", json={"input": [part]},
                                       headers={"Authorization": f"Bearer {key}"}).status_code
                    with self.lock:
                        self.statuses[status] = self.statuses.get(status, 0) + 1
                time.sleep(chooser.uniform(0.05, 0.3))


class Jobs:
    """One thread posting background jobs all run long, so the dashboard's jobs row has series: a keyframes
    job of four frames every ``every_s`` seconds and, every third time, a 9-second video (three scenes, the
    middle one violent) as a multipart upload, each as the first tenant."""

    def __init__(self, url: str, every_s: float = 10.0) -> None:
        self.url, self.every_s = url, every_s
        self.done = threading.Event()
        self.accepted: dict[str, int] = {"keyframes": 0, "video": 0}
        self.video = make_video([Scene("allow", 3, seed=1), Scene("block:violence", 3, seed=2),
                                 Scene("allow", 3, seed=3)])
        self.frames = [_data_url(make_keyframe(label, 640, 360, 1000 + seed))
                       for seed, label in enumerate(["allow", "allow", "block:violence", "allow"])]
        self.thread = threading.Thread(target=self._post, daemon=True)

    def _post(self) -> None:
        key = SHARES[0][0]
        with httpx.Client(base_url=self.url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
            for turn in range(1_000_000):
                if self.done.wait(self.every_s):
                    return
                with contextlib.suppress(httpx.HTTPError):
                    if turn % 3 == 2:
                        answer = http.post("/v1/jobs", files={
                            "video": ("clip.mp4", self.video, "video/mp4"),
                            "job": (None, json.dumps({"video_id": f"dashboard-{turn}"}), "application/json"),
                        })
                        kind = "video"
                    else:
                        frames = [{"timestamp_ms": 1000 * i, "image_url": {"url": url}}
                                  for i, url in enumerate(self.frames)]
                        body = {"video_id": f"dashboard-{turn}", "frames": frames}
                        answer = http.post("/v1/jobs", json=body)
                        kind = "keyframes"
                    if answer.status_code == 202:
                        self.accepted[kind] += 1


def _data_url(frame: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(frame).decode()


def set_policy(url: str, **changes: Any) -> None:
    """Change the thinking policy through the admin API."""
    headers = {"Authorization": f"Bearer {ADMIN}"}
    current = httpx.get(f"{url}/admin/thinking-policy", headers=headers).json()
    document = {**current, **changes, "reason": f"dashboard run: {changes}"}
    httpx.put(f"{url}/admin/thinking-policy", json=document, headers=headers).raise_for_status()


def alerts(prom: str) -> list[str]:
    """Alerts Prometheus has pending or firing now."""
    answer = httpx.get(f"{prom}/api/v1/alerts").json()["data"]["alerts"]
    return sorted(f"{a['labels']['alertname']} ({a['state']})" for a in answer)


def main() -> None:
    """Run the phases, then render."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--phase-s", type=float, default=60.0, help="seconds each phase lasts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="modgate-dashboard-") as tmp, private_redis() as redis_url, \
            simulator("spark", args.time_scale) as engine:
        env = {
            "MODGATE_REDIS__URL": redis_url,
            "MODGATE_AUTH__ADMIN_TOKEN": ADMIN,
            "MODGATE_AUTH__API_KEYS": ",".join(f"{key}:{tenant}" for key, tenant in TENANTS.items()),
            "MODGATE_ENGINE__MAX_INFLIGHT": "4",
            "MODGATE_ADMISSION__QUEUE_SIZE": "6",
            "MODGATE_TENANTS__KEYFRAMES_PER_MINUTE": "globex=40",
            "MODGATE_TELEMETRY__WINDOW_S": "60",
            "MODGATE_SHAPING__BLOCK_FILLING_PREFIX": "true",  # whole KV blocks shared: the cache row hits
        }
        with gateway(engine, **env) as url, prometheus(url.removeprefix("http://"), Path(tmp)) as prom:
            traffic, jobs = Traffic(url), Jobs(url)
            set_policy(url, shadow_share=0.2)
            jobs.thread.start()
            start = time.time()
            phases: list[tuple[str, int, Any]] = [
                ("steady: three tenants, thinking on, 20 % shadow pairs", 3, None),
                ("burst: 14 callers for 4 slots and a queue of 6 (429s)", 14, None),
                ("engine errors: 30 % of engine calls fail", 3, {"error_rate": 0.3}),
                ("escalate mode: thinking only for unsure fast verdicts", 3, {"error_rate": 0.0}),
                ("thinking off", 3, "off"),
            ]
            marks = []
            for name, workers, change in phases:
                marks.append(time.time() - start)
                if isinstance(change, dict):
                    httpx.post(f"{engine}/sim/faults", json=change).raise_for_status()
                if name.startswith("escalate"):
                    set_policy(url, default_mode="escalate")
                if change == "off":
                    set_policy(url, default_mode="off")
                traffic.workers(workers)
                time.sleep(args.phase_s)
                statuses = dict(sorted(traffic.statuses.items()))
                print(f"{time.time() - start:5.0f} s  {name}: statuses so far {statuses}")
                print(f"         alerts: {', '.join(alerts(prom)) or 'none'}")
            traffic.done.set()
            jobs.done.set()
            print(f"jobs accepted: {jobs.accepted}")
            end = time.time()
            time.sleep(3)  # a last scrape
            load = os.getloadavg()
            phase_names = ", ".join(name.split(":")[0] for name, _, _ in phases)
            caption = (
                "A rendering (matplotlib, deploy/monitoring/render.py) of modgate-dashboard.json, not a "
                "Grafana screenshot.\n"
                f"Series: a real Prometheus scraping a real gateway for {end - start:.0f} s "
                f"(python -m bench.dashboard_run; the simulator at time scale {args.time_scale:g}; phases of "
                f"{args.phase_s:g} s, dotted lines: {phase_names}).\n"
                f"Machine load {load[0]:.1f} (1 min) / {load[1]:.1f} (5 min) on 2 cores shared."
            )
            render(json.loads(DASHBOARD.read_text()), prom, start, end, 5.0, args.out, caption, marks[1:])
            print(f"wrote {args.out}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
