"""People in the loop from end to end: a reviewer signs in through the real OpenID provider, labels the queued
frames of their tenant on the console's review page in headless Chromium, and the weekly report built from
the decision log those labels went into scores each thinking arm against them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import redis
from playwright.sync_api import expect
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app
from contracts.decisions import DecisionRow
from deploy.keyframes import make_keyframe
from tests.browser import chromium_page
from tests.oidc.support import KEYS, PUBLIC_CLIENT
from tests.oidc.test_oidc_browser import sign_in
from tests.support import GatewayFactory, image_input

pytestmark = [pytest.mark.browser, pytest.mark.redis]

# Each frame's expected verdict on the simulator, and what the reviewer decides on the page: a block of a
# frame they find harmless, agreement otherwise (the keys: a allow, 3 block with violence).
FRAMES = {"allow": "a", "block:violence": "a", "review": "3"}


def moderate(gateway: ThreadedServer, tenant: str, thinking: str, seed: int) -> None:
    frames = [make_keyframe(label, 320, 180, seed=seed + n) for n, label in enumerate(FRAMES)]
    answer = httpx.post(f"{gateway.url}/v1/moderations", json={"input": image_input(*frames)}, timeout=60,
                        headers={"Authorization": f"Bearer {KEYS[tenant]}", "X-Modgate-Thinking": thinking})
    assert answer.status_code == 200, answer.text


def test_a_reviewer_signed_in_through_the_provider_labels_in_chromium_and_the_report_scores_each_arm(
    oidc_gateway: GatewayFactory, redis_url: str, tmp_path: Path
) -> None:
    stream = f"test:oidc-labels:{tmp_path.name}"
    gateway = oidc_gateway(
        redis_url=redis_url, oidc={"client_id": PUBLIC_CLIENT, "client_secret": None},
        review={"audit_sample_rate": 1.0},  # every confident verdict audited: each label weighs 1
        decisions={"stream": stream, "archive_dir": str(tmp_path / "decisions")},
    )
    moderate(gateway, "tenant-a", "off", seed=500)
    moderate(gateway, "tenant-a", "on", seed=510)
    moderate(gateway, "tenant-b", "off", seed=520)  # another tenant's: never on rita's page

    labelled = 0
    with chromium_page(1280, 900) as watched:
        page = sign_in(watched, gateway, "rita", home="/console/review")
        expect(page.locator("#queue-tenant-a .depth")).to_have_text("6")
        with page.expect_navigation():
            page.keyboard.press("n")
        while page.locator("#item-frame").count():
            assert page.locator("#item-tenant").inner_text() == "tenant-a"
            model = page.locator("#model-action").inner_text()
            key = "3" if model == "review" else "a"
            with page.expect_navigation():
                page.keyboard.press(key)
            labelled += 1
            assert labelled <= 6
        expect(page.locator("#item-heading")).to_have_text("The queue is empty")
    assert labelled == 6
    assert watched.problems == []

    rows = [DecisionRow.model_validate_json(fields[b"row"])
            for _, fields in redis.Redis.from_url(redis_url).xrange(stream)]
    labels = [row for row in rows if row.kind == "label"]
    assert len(labels) == 6
    assert {row.labelled_by for row in labels} == {"rita@example.test (oidc:rita, console)"}
    assert {row.tenant for row in labels} == {"tenant-a"}

    out = tmp_path / "reports"
    (tmp_path / "records").mkdir()
    result = CliRunner().invoke(app, [
        "quality", "report", "--week", "current", "--records", str(tmp_path / "records"), "--out", str(out),
        "--trend-weeks", "0", "--bootstrap", "100", "--decisions", str(tmp_path / "decisions"),
        "--decisions-redis-url", redis_url, "--decisions-stream", stream,
    ])
    assert result.exit_code == 0, result.output
    assert "Against 6 human labels" in " ".join(result.output.split())
    report = json.loads(next(out.glob("quality-*.json")).read_text())
    arms = {row["arm"]: row for row in report["labels"]["arms"]}
    assert {arm: row["labels"] for arm, row in arms.items()} == {"off": 3, "on": 3}
    judged = {row.engine_request_id: row for row in rows if row.kind != "label"}
    for arm, row in arms.items():
        agreed = sum(
            label.action == judged[label.engine_request_id].action for label in labels
            if judged[label.engine_request_id].thinking_mode == arm
        )
        assert row["accuracy"]["value"] == agreed / 3, (arm, row)
        assert row["accuracy"]["low"] <= row["accuracy"]["value"] <= row["accuracy"]["high"]
