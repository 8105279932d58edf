"""Issue 48's case through the HTTP API: one video of four keyframes packed two to an engine request, every
verdict audited, every item labelled with the model's own verdict, and `modgate quality report` grading each
label against the verdict it labels (joined by ``decision_id``, not by the engine request packed frames
share or a reused verdict carries)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import redis
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app
from contracts.decisions import DecisionRow
from deploy.keyframes import render_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, data_url

KEY = "k-video-0123456:news"
STREAM = "test:packed-labels:decisions"
LABELS = ["allow", "block:violence", "allow", "block:violence"]


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": "alice"}


def jpeg(label: str) -> bytes:
    buffer = io.BytesIO()
    render_keyframe(label, 320, 180).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def label_with_the_models_verdict(url: str) -> list[dict[str, Any]]:
    """Claim every queued item and label it exactly as the model judged it."""
    done = []
    claim = f"{url}/admin/review/claim"
    while (claimed := httpx.post(claim, headers=admin(), timeout=10)).status_code != 204:
        assert claimed.status_code == 200, claimed.text
        item = claimed.json()
        body = {"action": item["action"], "categories": item["categories"]}
        path = f"{url}/admin/review/{item['id']}/label"
        labelled = httpx.post(path, headers=admin(), json=body, timeout=10)
        assert labelled.status_code == 200, labelled.text
        assert labelled.json()["agrees"] is True
        done.append(item)
    return done


def test_four_packed_keyframes_labelled_as_judged_grade_four_labels_all_correct(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, tmp_path: Path
) -> None:
    gateway = start_gateway(
        engine={"url": sim.url},
        auth={"api_keys": KEY},
        redis={"url": redis_url},
        review={"audit_sample_rate": 1.0},
        decisions={"stream": STREAM, "archive_dir": str(tmp_path / "decisions")},
    )
    answer = httpx.post(
        f"{gateway.url}/v1/videos/clip-1/keyframes",
        json={"frames": [{"image_url": {"url": data_url(jpeg(label))}} for label in LABELS], "packing": 2},
        headers={"Authorization": f"Bearer {KEY.split(':')[0]}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    frames = answer.json()["frames"]
    assert [frame["modgate"]["action"] for frame in frames] == ["allow", "block", "allow", "block"]
    decision_ids = [frame["modgate"]["decision_id"] for frame in frames]
    assert len(set(decision_ids)) == 4  # packed frames and reused verdicts each have their own
    assert len({frame["modgate"]["request_id"] for frame in frames}) < 4  # the case: engine requests shared

    labelled = label_with_the_models_verdict(gateway.url)
    assert sorted(item["decision_id"] for item in labelled) == sorted(decision_ids)

    entries = redis.Redis.from_url(redis_url).xrange(STREAM)
    rows = [DecisionRow.model_validate_json(fields[b"row"]) for _, fields in entries]
    decisions = [row for row in rows if row.kind != "label"]
    labels = [row for row in rows if row.kind == "label"]
    assert sorted(row.decision_id or "" for row in decisions) == sorted(decision_ids)
    assert sorted(row.decision_id or "" for row in labels) == sorted(decision_ids)
    # a label's request is the moderation request the decision's row names (no engine-request suffix)
    assert {row.request_id for row in labels} == {row.request_id for row in decisions}

    (tmp_path / "records").mkdir()
    out = tmp_path / "reports"
    result = CliRunner().invoke(app, [
        "quality", "report", "--week", "current", "--records", str(tmp_path / "records"), "--out", str(out),
        "--trend-weeks", "0", "--bootstrap", "100", "--decisions", str(tmp_path / "decisions"),
        "--decisions-redis-url", redis_url, "--decisions-stream", STREAM,
    ])
    assert result.exit_code == 0, result.output
    section = json.loads(next(out.glob("quality-*.json")).read_text())["labels"]
    assert section["labels"] == 4
    assert sum(row["labels"] for row in section["arms"]) == 4
    assert all(row["accuracy"]["value"] == 1.0 for row in section["arms"])
    (stratum,) = section["strata"]  # every decision audited at rate 1, every one labelled: each weighs 1
    assert (stratum["reason"], stratum["queued"], stratum["labelled"]) == ("audit", 4, 4)
    assert stratum["weight"] == 1.0
    assert "| audit | 1.0 | 4 | 4 | 1 |" in next(out.glob("quality-*.md")).read_text()
