"""A week through the real gateway: moderations on the simulator, items queued and labelled by people over
HTTP, every label in the decision log (Redis), and `modgate quality report` scoring each arm against them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import redis
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app
from contracts.decisions import DecisionRow
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

KEYS = "k-news-0123:news,k-kids-0123:kids,k-arch-0123:archive"
STREAM = "test:labels:decisions"
# the thinking mode each tenant's frames are judged in: one arm a tenant
RULES = [
    {"name": "kids-think", "tenants": ["kids"], "mode": "on"},
    {"name": "archive-escalates", "tenants": ["archive"], "mode": "escalate"},
]


def admin(who: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": who}


def moderate(url: str, key: str, frames: list[bytes]) -> None:
    response = httpx.post(
        f"{url}/v1/moderations",
        json={"model": "m", "input": image_input(*frames)},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text


def label_everything(url: str) -> list[dict[str, Any]]:
    """Claim and label every queued item: a person overturns every block (allow) and agrees otherwise."""
    done = []
    while (
        claimed := httpx.post(f"{url}/admin/review/claim", headers=admin(), timeout=10)
    ).status_code == 200:
        item = claimed.json()
        body = (
            {"action": "allow", "categories": []}
            if item["action"] == "block"
            else {"action": item["action"], "categories": item["categories"]}
        )
        labelled = httpx.post(
            f"{url}/admin/review/{item['id']}/label", headers=admin(), json=body, timeout=10
        )
        assert labelled.status_code == 200, labelled.text
        done.append(item)
    assert claimed.status_code == 204, claimed.text
    return done


def test_labels_go_into_the_decision_log_and_the_weekly_report_scores_each_arm_with_them(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, tmp_path: Path
) -> None:
    gateway = start_gateway(
        engine_url=sim.url,
        api_keys=KEYS,
        redis_url=redis_url,
        review={"audit_sample_rate": 1.0},  # every confident verdict is audited: a rate of 1 weighs 1
        decisions={"stream": STREAM, "archive_dir": str(tmp_path / "decisions")},
    )
    current = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=admin(), timeout=10).json()
    put = httpx.put(
        f"{gateway.url}/admin/thinking-policy",
        headers=admin(),
        timeout=10,
        json={**current, "default_mode": "off", "rules": RULES, "reason": "one arm a tenant"},
    )
    assert put.status_code == 200, put.text
    frames = [
        make_keyframe("block:violence", 320, 180, seed=21),
        make_keyframe("allow", 320, 180, seed=22),
        make_keyframe("allow", 320, 180, seed=23),
    ]
    for key in ("k-news-0123", "k-kids-0123", "k-arch-0123"):
        moderate(gateway.url, key, frames)

    labelled = label_everything(gateway.url)
    assert len(labelled) == 9  # three frames of three tenants, none reused across tenants
    blocks = sum(item["action"] == "block" for item in labelled)

    entries = redis.Redis.from_url(redis_url).xrange(STREAM)
    rows = [DecisionRow.model_validate_json(fields[b"row"]) for _, fields in entries]
    labels = [row for row in rows if row.kind == "label"]
    assert len(labels) == 9
    assert {(row.labelled_by or "").split(" ")[0] for row in labels} == {"alice"}
    assert {row.review_reason for row in labels} <= {"audit", "review"}
    assert {row.audit_sample_rate for row in labels} == {1.0}
    assert all(row.frame_sha256 and row.engine_request_id for row in labels)

    out = tmp_path / "reports"
    args = [
        "quality",
        "report",
        "--week",
        "current",
        "--records",
        str(tmp_path / "records"),
        "--out",
        str(out),
        "--trend-weeks",
        "0",
        "--bootstrap",
        "100",
        "--decisions",
        str(tmp_path / "decisions"),
        "--decisions-redis-url",
        redis_url,
        "--decisions-stream",
        STREAM,
    ]
    (tmp_path / "records").mkdir()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Against 9 human labels" in " ".join(result.output.split())  # the headline, as rich wraps it
    report = json.loads(next(out.glob("quality-*.json")).read_text())
    section = report["labels"]
    arms = {row["arm"]: row for row in section["arms"]}
    assert set(arms) == {"off", "on", "escalate"}
    assert sum(row["labels"] for row in arms.values()) == 9
    # every block was overturned, every other verdict kept: accuracy is the share not blocked, per arm
    wrong = Counter(row.thinking_mode for row in rows if row.kind != "label" and row.action == "block")
    for arm, row in arms.items():
        assert row["accuracy"]["value"] == (row["labels"] - wrong[arm]) / row["labels"]
        assert row["accuracy"]["low"] <= row["accuracy"]["value"] <= row["accuracy"]["high"]
    assert blocks == sum(wrong.values()) > 0
    assert section["threshold"]["source"] == "agreement"  # no pairs this week: too few to choose from labels
    assert "from thinking-on agreement" in section["threshold"]["note"]
    tenants = {row["tenant"]: row for row in report["tenant_decisions"]}
    assert set(tenants) == {"news", "kids", "archive"}
    assert all(row["labelled"] == 3 for row in tenants.values())
    summary = report["trend"][-1]
    assert summary["threshold_source"] == "agreement"
    assert set(summary["label_accuracy"]) == {f"{arm}/{row['engine']}" for arm, row in arms.items()}
    assert set(summary["tenants"]) == {"news", "kids", "archive"}
