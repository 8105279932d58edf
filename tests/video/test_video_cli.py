"""``modgate video moderate``: a video file posted as a job, its segments printed."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app
from deploy.videos import Scene, make_video
from tests.support import GatewayFactory


def test_video_moderate_prints_the_segments_of_a_file(gateway: ThreadedServer, tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(make_video([Scene("allow", 2, seed=1), Scene("block:hate", 2, seed=2)]))
    result = CliRunner().invoke(app, ["video", "moderate", str(clip), "--gateway-url", gateway.url])
    assert result.exit_code == 0, result.output
    assert "block" in result.output
    assert "hate" in result.output
    assert "video verdict: block" in result.output


def test_video_moderate_json_is_the_finished_job(gateway: ThreadedServer, tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(make_video([Scene("allow", 2, seed=1), Scene("block:hate", 2, seed=2)]))
    result = CliRunner().invoke(app, ["video", "moderate", str(clip), "--gateway-url", gateway.url, "--json"])
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    segments = [(s["action"], s["categories"], s["start_ms"], s["end_ms"]) for s in job["result"]["segments"]]
    assert segments == [("allow", [], 0, 2000), ("block", ["hate"], 2000, 4000)]
    assert job["video_id"] == "clip.mp4"


def test_video_moderate_exits_1_with_the_reason_when_the_gateway_refuses(
    gateway: ThreadedServer, tmp_path: Path
) -> None:
    still = tmp_path / "still.mp4"
    still.write_bytes(b"\xff\xd8\xff\xe0 not a video at all")
    result = CliRunner().invoke(app, ["video", "moderate", str(still), "--gateway-url", gateway.url])
    assert result.exit_code == 1
    assert "refused the video" in result.output


def test_video_moderate_sends_a_file_as_itself_not_as_base64(
    start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path
) -> None:
    """Posted as multipart: a body limit the file fits but its base64 (4/3 of it) does not still takes it."""
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(make_video([Scene("allow", 2, seed=1), Scene("block:hate", 2, seed=2)]))
    size = clip.stat().st_size
    gateway = start_gateway(engine={"url": sim.url}, shaping={"max_body_bytes": size + 16 * 1024})
    assert size + 16 * 1024 < size * 4 // 3  # the JSON of a data: URL would be refused
    result = CliRunner().invoke(app, ["video", "moderate", str(clip), "--gateway-url", gateway.url])
    assert result.exit_code == 0, result.output
    assert "video verdict: block" in result.output
