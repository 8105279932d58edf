"""Pages in Debian's headless Chromium (driven by Playwright) that record what went wrong on them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import ConsoleMessage, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"  # Debian's: never `playwright install`
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"  # screenshots to look at


@dataclass
class WatchedPage:
    """A browser page, with every console error or warning, page error and requested URL it saw."""

    page: Page
    problems: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@contextmanager
def chromium_page(width: int, height: int) -> Iterator[WatchedPage]:
    """A ``width``×``height`` page in headless Chromium, closed with the browser when the block ends.

    Fails, never skips, when Chromium is missing: a browser test that silently did not run proves nothing."""
    assert Path(CHROMIUM).exists(), (
        f"Debian's Chromium is missing at {CHROMIUM}: apt-get update && apt-get install -y chromium"
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            watched = WatchedPage(
                browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
            )

            def on_console(message: ConsoleMessage) -> None:
                if message.type in ("error", "warning"):
                    watched.problems.append(f"{message.type}: {message.text}")

            watched.page.on("console", on_console)
            watched.page.on("pageerror", lambda error: watched.problems.append(f"page error: {error}"))
            watched.page.on("request", lambda request: watched.requests.append(request.url))
            yield watched
        finally:
            browser.close()
