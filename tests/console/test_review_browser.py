"""The reviewer's page in headless Chromium, used as a reviewer would: frames queued through the real gateway
(an async job and a moderation, every verdict sampled for audit, the queue in a real Redis), a user signs
in, opens the page from the console's navigation and labels every item with its keys, skipping one that
comes back. The labels reach the job's result beside the model's verdicts and the audit trail with the
user's name; the queue ends empty. Saves a screenshot of the page with an item on it (artifacts/review.png;
docs/review.png too with ``MODGATE_WRITE_DOCS_SCREENSHOTS=1``)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Page, expect

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.browser import ARTIFACTS, chromium_page
from tests.processes import poll
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

KEYS = {"a-key-0123456789": "tenant-a", "b-key-0123456789": "tenant-b"}
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "review.png"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def submit_job(gateway: ThreadedServer, key: str, labels: list[str], seed: int) -> str:
    """An async job of one keyframe per label; its id once it succeeded."""
    frames = image_input(*(make_keyframe(label, 640, 360, seed=seed + n) for n, label in enumerate(labels)))
    headers = {"Authorization": f"Bearer {key}"}
    submitted = httpx.post(f"{gateway.url}/v1/jobs", headers=headers, timeout=30,
                           json={"video_id": "clip-7", "frames": frames})
    assert submitted.status_code == 202, submitted.text
    job_id: str = submitted.json()["id"]
    poll(lambda: job(gateway, key, job_id)["status"] == "succeeded", 60, "the job to succeed")
    return job_id


def job(gateway: ThreadedServer, key: str, job_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{gateway.url}/v1/jobs/{job_id}", timeout=10,
                                       headers={"Authorization": f"Bearer {key}"}).json()
    return answer


def item_on_page(page: Page) -> str | None:
    """The id of the item the page shows (None: no item)."""
    match = re.search(r"item=(rev-[0-9a-f]{32})", page.url)
    return match.group(1) if match and page.locator("#item-frame").count() else None


def press(page: Page, key: str) -> None:
    """One key, and the page it leads to (the decision's post, then the next item)."""
    with page.expect_navigation():
        page.keyboard.press(key)


def screenshot(page: Page) -> None:
    """The page as it is, in artifacts/ (and as docs/review.png with MODGATE_WRITE_DOCS_SCREENSHOTS=1)."""
    expect(page.locator("#item-frame")).to_have_js_property("complete", True)
    page.screenshot(path=str(ARTIFACTS / "review.png"), full_page=True)
    if os.environ.get("MODGATE_WRITE_DOCS_SCREENSHOTS") == "1":
        shutil.copyfile(ARTIFACTS / "review.png", DOCS_SCREENSHOT)


def human_decision(model_action: str) -> tuple[str, str, list[str]]:
    """What the reviewer decides, by what the model said: a key and the label it records (each case shows
    up in the job's reviews: an allow agreed with, a block overturned, a review made a block)."""
    if model_action == "review":
        return "3", "block", ["violence"]
    return "a", "allow", []


@pytest.mark.browser
@pytest.mark.redis
def test_a_reviewer_labels_queued_frames_with_the_keys_in_chromium(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str
) -> None:
    gateway = start_gateway(
        engine_url=sim.url, redis_url=redis_url, api_keys=",".join(f"{k}:{t}" for k, t in KEYS.items()),
        review={"audit_sample_rate": 1.0},  # every verdict goes to people, the sure ones as audit samples
    )
    a_key, b_key = KEYS
    job_id = submit_job(gateway, a_key, ["review", "block:violence", "allow"], seed=300)
    moderated = httpx.post(f"{gateway.url}/v1/moderations", timeout=30,
                           headers={"Authorization": f"Bearer {b_key}"},
                           json={"input": image_input(make_keyframe("review", 640, 360, seed=400))})
    assert moderated.status_code == 200, moderated.text
    queued = httpx.get(f"{gateway.url}/admin/review/queue", headers=ADMIN, timeout=10).json()["tenants"]
    assert {tenant: q["depth"] for tenant, q in queued.items()} == {"tenant-a": 3, "tenant-b": 1}

    decided: dict[str, tuple[str, str, list[str]]] = {}  # item id → model action, human action, categories
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "review.png").unlink(missing_ok=True)
    with chromium_page(1280, 900) as watched:
        page = watched.page
        page.goto(f"{gateway.url}/console")
        page.fill("#operator", "alice")
        page.fill("#token", ADMIN_TOKEN)
        page.click("#sign-in-form button[type=submit]")
        page.click("#nav-review")
        expect(page.locator("#nav-review")).to_have_attribute("aria-current", "page")
        expect(page.locator("#queue-tenant-a .depth")).to_have_text("3")
        expect(page.locator("#queue-tenant-b .depth")).to_have_text("1")
        expect(page.locator("#item-heading")).to_have_text("No item in hand")
        expect(page.locator("#keys")).to_contain_text("Block: violence")
        expect(page.locator("#next-button")).to_be_focused()

        press(page, "n")
        first = item_on_page(page)
        assert first is not None
        expect(page.locator("#item-frame")).to_have_js_property("complete", True)
        assert page.locator("#item-frame").evaluate("image => image.naturalWidth") > 0
        expect(page.locator("#item-why")).to_contain_text("Queued because")
        expect(page.locator("#model-reasoning")).not_to_be_empty()  # thinking was on: its reasoning shows
        expect(page.locator("#decide-a")).to_be_focused()

        seen: list[str] = []
        while (shown := item_on_page(page)) is not None:
            seen.append(shown)
            model_action = page.locator("#model-action").inner_text()
            if model_action == "review" and not (ARTIFACTS / "review.png").exists():
                screenshot(page)  # the page with an item the model was unsure of
            if len(seen) == 1:
                press(page, "s")  # skipped: back to the end of its tenant's queue
                expect(page.locator("#notice")).to_contain_text("Skipped")
                continue
            key, action, categories = human_decision(model_action)
            press(page, key)
            decided[shown] = (model_action, action, categories)
            assert len(seen) <= 6, seen  # four items and the skipped one once more
        expect(page.locator("#item-heading")).to_have_text("The queue is empty")
        expect(page.locator("#queue-empty")).to_be_visible()
        expect(page.locator("#notice")).to_contain_text("Recorded")

    assert (ARTIFACTS / "review.png").exists()  # a review verdict was on the page
    assert first in decided  # the skipped item came back and was labelled
    assert sorted(seen[1:]) == sorted(decided)
    assert len(decided) == 4
    assert httpx.get(f"{gateway.url}/admin/review/queue", headers=ADMIN, timeout=10).json() == {"tenants": {}}

    audit = httpx.get(f"{gateway.url}/admin/review/audit", headers=ADMIN, timeout=10).json()["data"]
    assert {entry["item_id"] for entry in audit} == set(decided)
    for entry in audit:
        assert re.fullmatch(r"alice \(admin:[0-9a-f]+, console\)", entry["reviewer"]), entry["reviewer"]
        model_action, action, categories = decided[entry["item_id"]]
        assert (entry["model"]["action"], entry["label"]) == (model_action, {"action": action,
                                                                             "categories": categories})
    reviews = {review["request_id"]: review for review in job(gateway, a_key, job_id)["reviews"]}
    by_request = {entry["request_id"]: decided[entry["item_id"]] for entry in audit
                  if entry["job_id"] == job_id}
    assert len(reviews) == 3
    for request_id, (model_action, action, categories) in by_request.items():
        review = reviews[request_id]
        assert (review["model_action"], review["action"], review["categories"]) == (
            model_action, action, categories
        )
    assert watched.problems == []
    foreign = [url for url in watched.requests if urlsplit(url).netloc != urlsplit(gateway.url).netloc]
    assert foreign == []
