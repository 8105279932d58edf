"""A label goes back: into its async job beside the model's verdict, to the job's webhook (signed, retried),
into the audit trail with the reviewer's name, and into the review metrics."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.jobs.webhooks import verify_webhook
from tests.processes import poll
from tests.reliability.conftest import WEBHOOK_SECRET, WebhookReceiver
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

API_KEY = "key-a-0123456789"


def admin(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Modgate-Operator": who}


def metric(gateway: ThreadedServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_a_label_reaches_the_job_its_webhook_and_the_audit(
    start_gateway: GatewayFactory, sim: ThreadedServer, webhook_receiver: WebhookReceiver
) -> None:
    gateway = start_gateway(
        engine_url=sim.url, api_keys=f"{API_KEY}:tenant-a",
        jobs={"webhook_secret": WEBHOOK_SECRET, "webhook_allowlist": ["127.0.0.1"]},
    )
    business = {"Authorization": f"Bearer {API_KEY}"}
    frames = image_input(make_keyframe("review", 320, 180, seed=5), make_keyframe("allow", 320, 180, seed=6))
    submitted = httpx.post(f"{gateway.url}/v1/jobs", headers=business, timeout=30, json={
        "video_id": "clip-1", "frames": frames, "webhook_url": webhook_receiver.url,
    })
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]

    def job() -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"{gateway.url}/v1/jobs/{job_id}", headers=business,
                                           timeout=10).json()
        return answer

    poll(lambda: job()["status"] == "succeeded", 60, "the job to succeed")
    poll(lambda: len(webhook_receiver.deliveries) == 1, 30, "the job's finished webhook")
    webhook_receiver.fail_first[0] = 1  # the review webhook is refused once: retried

    item = httpx.post(f"{gateway.url}/admin/review/claim", headers=admin("alice"), timeout=10).json()
    assert item["action"] == "review"
    labelled = httpx.post(f"{gateway.url}/admin/review/{item['id']}/label", headers=admin("alice"),
                          timeout=10, json={"action": "block", "categories": ["violence"]})
    assert labelled.status_code == 200, labelled.text

    (review,) = job()["reviews"]
    assert (review["request_id"], review["action"], review["categories"]) == (
        item["request_id"], "block", ["violence"]
    )
    assert (review["model_action"], review["agrees"]) == ("review", False)

    poll(lambda: len(webhook_receiver.deliveries) == 2, 30, "the review webhook")
    reviewed = webhook_receiver.deliveries[1]
    assert reviewed.headers["x-modgate-event"] == "job.reviewed"
    assert verify_webhook(WEBHOOK_SECRET, reviewed.headers["x-modgate-signature"], reviewed.body)
    assert b'"reviews":[{' in reviewed.body

    audit = httpx.get(f"{gateway.url}/admin/review/audit", headers=admin("alice"), timeout=10).json()
    (entry,) = audit["data"]
    assert entry["reviewer"].startswith("alice (admin:")
    assert (entry["item_id"], entry["job_id"], entry["tenant"]) == (item["id"], job_id, "tenant-a")
    assert (entry["model"]["action"], entry["label"]["action"], entry["agrees"]) == ("review", "block", False)

    assert metric(gateway, "modgate_review_labels_total", tenant="tenant-a", agrees="false") == 1
    assert metric(gateway, "modgate_review_enqueued_total", tenant="tenant-a", reason="review") == 1
    assert metric(gateway, "modgate_review_queue_depth", tenant="tenant-a") == 0


def test_the_queue_gauges_show_depth_and_age(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys=f"{API_KEY}:tenant-a",
                            review={"oldest_alert_s": 900})
    frames = image_input(*(make_keyframe("review", 320, 180, seed=20 + n) for n in range(3)))
    answer = httpx.post(f"{gateway.url}/v1/moderations", json={"input": frames}, timeout=30,
                        headers={"Authorization": f"Bearer {API_KEY}"})
    assert answer.status_code == 200
    httpx.post(f"{gateway.url}/admin/review/claim", headers=admin("alice"), timeout=10)
    assert metric(gateway, "modgate_review_queue_depth", tenant="tenant-a") == 3
    assert metric(gateway, "modgate_review_claimed", tenant="tenant-a") == 1
    assert metric(gateway, "modgate_review_oldest_age_seconds", tenant="tenant-a") >= 0
    assert metric(gateway, "modgate_review_oldest_alert_seconds") == 900
