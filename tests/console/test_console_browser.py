"""The operations console in headless Chromium: sign in, flip thinking off with a reason, see the audit
entry, and check that the gateway's next engine request carries thinking off. Saves a screenshot."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from playwright.sync_api import expect

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from quality.report import ReportPolicy, build_weekly_report, write_report
from tests.browser import ARTIFACTS, chromium_page
from tests.quality.fakes import synthesize_week
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class RecordingEngine:
    """The engine simulator's ASGI app, keeping the JSON body of every chat completion the gateway sends."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.chat_requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        self.chat_requests.append(json.loads(body))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what follows the body: the client's disconnect

        await self.app(scope, replay, send)


@pytest.fixture
def recording_engine() -> Iterator[tuple[ThreadedServer, RecordingEngine]]:
    """The Spark-calibrated simulator, fifty times faster than the Spark, recording the gateway's requests."""
    engine = RecordingEngine(create_sim_app(PRESETS["spark"], 0.02))
    with ThreadedServer(engine) as server:
        yield server, engine


def moderate_frames(gateway: ThreadedServer, labels_and_seeds: list[tuple[str, int]]) -> list[Any]:
    """One keyframe per call, four callers at once, through the official client; the results in order."""

    def one(label_seed: tuple[str, int]) -> Any:
        label, seed = label_seed
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
            frame = make_keyframe(label, 640, 360, seed=seed)
            return client.moderations.create(model="modgate-moderation", input=image_input(frame)).results[0]

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, labels_and_seeds))


def traffic(first_seed: int, count: int) -> list[tuple[str, int]]:
    """Keyframes with distinct content (no verdict reuse), mostly allowed, some flagged."""
    labels = ["allow", "allow", "review", "allow", "block:violence", "allow"]
    return [(labels[i % len(labels)], first_seed + i) for i in range(count)]


def weekly_report(directory: Path) -> str:
    """Write one weekly quality report where the console reads them; answers its recommendation's title."""
    week = synthesize_week(frames=1200, videos=90, rerun_fraction=0.15, labels_fraction=0.1, seed=48)
    report = build_weekly_report(
        week.records, "2026-W48", ReportPolicy(), [], generated_at=datetime(2026, 11, 30, 6, 15, tzinfo=UTC)
    )
    write_report(report, directory)
    return report.recommendation.title


@pytest.mark.browser
def test_an_operator_flips_thinking_off_in_chromium_and_the_next_engine_request_has_it_off(
    tmp_path: Path,
    recording_engine: tuple[ThreadedServer, RecordingEngine],  # before the gateway: stopped after it
    start_gateway: GatewayFactory,
) -> None:
    reports = tmp_path / "reports"
    recommendation = weekly_report(reports)
    sim, engine = recording_engine
    gateway = start_gateway(
        engine_url=sim.url,
        console={"reports_dir": str(reports), "poll_interval_s": 1},
        telemetry={"engine_scrape_interval_s": 1},
    )
    before = moderate_frames(gateway, traffic(100, 16))
    assert {result.model_extra["modgate"]["thinking"] for result in before} == {"on"}

    reason = "Evening peak: queue over 40, shedding reasoning until 22:00"
    with chromium_page(1280, 900) as watched:
        page = watched.page

        # Sign in: the form, then the console with thinking on.
        page.goto(f"{gateway.url}/console")
        expect(page.locator("#sign-in-form")).to_be_visible()
        page.fill("#operator", "alice")
        page.fill("#token", ADMIN_TOKEN)
        page.click("#sign-in-form button[type=submit]")
        expect(page.locator("#policy-mode")).to_have_text("thinking ON")
        expect(page.locator("#audit-empty")).to_be_visible()
        expect(page.locator("#quality-decision")).to_have_text(recommendation)
        expect(page.locator("#health-ready")).to_have_text("yes")
        session = next(c for c in page.context.cookies() if c["name"] == "modgate_console")
        assert session["httpOnly"]
        assert session["sameSite"] == "Strict"
        assert ADMIN_TOKEN not in session["value"]

        # Flip thinking off with a reason: the audit entry appears, naming the operator.
        page.fill("#reason", reason)
        page.click("#flip-button")
        expect(page.locator("#notice")).to_contain_text("thinking OFF")
        expect(page.locator("#policy-mode")).to_have_text("thinking OFF")
        newest = page.locator("#audit-table tbody tr").first
        expect(newest).to_contain_text("alice (admin:")
        expect(newest).to_contain_text("default_mode on → off")
        expect(newest).to_contain_text(reason)

        # The gateway's next engine request carries thinking off.
        sent_before = len(engine.chat_requests)
        (after,) = moderate_frames(gateway, [("allow", 500)])
        assert after.model_extra["modgate"]["thinking"] == "off"
        assert after.model_extra["modgate"]["thinking_rule"] == "default"
        assert after.model_extra["modgate"]["policy_version"] == 2
        (next_request,) = engine.chat_requests[sent_before:]
        assert next_request["chat_template_kwargs"]["enable_thinking"] is False

        # More traffic with thinking off; the live panels pick it up without a reload.
        moderate_frames(gateway, traffic(600, 7))
        expect(page.locator("#fig-keyframes")).to_contain_text("24 (", timeout=15_000)
        expect(page.locator("#fig-thinking")).not_to_contain_text("100 %")
        expect(page.locator("#fig-cache")).not_to_contain_text("–", timeout=15_000)
        page.locator("#reason").blur()

        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "console.png"), full_page=True)

    audit = httpx.get(f"{gateway.url}/admin/audit", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    (entry,) = audit["data"]
    assert entry["actor"].startswith("alice (admin:")
    assert entry["reason"] == reason
    assert entry["changes"] == {"default_mode": {"old": "on", "new": "off"}}
    assert watched.problems == []
    foreign = [url for url in watched.requests if urlsplit(url).netloc != urlsplit(gateway.url).netloc]
    assert foreign == []
