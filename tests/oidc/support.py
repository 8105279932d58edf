"""The test OpenID provider's clients and accounts (tests/oidc/provider.mjs), the running provider, and a
person signing in through its own login and consent pages with httpx, as a browser would."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import image_input

HERE = Path(__file__).resolve().parent
CONSOLE_CLIENT = ("modgate-console", "modgate-console-secret-0123456789")  # confidential (provider.mjs)
PUBLIC_CLIENT = "modgate-public"  # public: PKCE alone
SCOPES = "openid email profile modgate"  # "modgate" releases the roles and tenants claims
KEYS = {"tenant-a": "key-a-0123456789", "tenant-b": "key-b-0123456789"}  # the tests' business API keys
REVIEWERS = frozenset({"rita", "ravi"})  # the provider's reviewers (provider.mjs); olivia operates


@dataclass
class OidcProvider:
    """The running provider: its issuer URL and its process."""

    issuer: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """What the provider printed."""
        return self.log_path.read_text(errors="replace")


_FORM = re.compile(r'<form[^>]*action="([^"]+)"[^>]*method="post"', re.IGNORECASE)
_PROMPT = re.compile(r'name="prompt" value="([a-z]+)"')


def through_provider(browser: httpx.Client, url: str, login: str, stop_at: str) -> httpx.Response:
    """Follow ``url`` as a browser would: the provider's redirects, its login form (as ``login``, any
    password) and its consent form, until a redirect leads to ``stop_at``; answers that redirect."""
    response = browser.get(url)
    for _ in range(20):
        if response.is_redirect:
            location = urljoin(str(response.url), response.headers["location"])
            if location.startswith(stop_at):
                return response
            response = browser.get(location)
            continue
        assert response.status_code == 200, f"{response.status_code} at {response.url}: {response.text[:500]}"
        form, prompt = _FORM.search(response.text), _PROMPT.search(response.text)
        assert form, f"no form at {response.url}: {response.text[:500]}"
        assert prompt, f"no prompt in the form at {response.url}"
        fields = {"prompt": prompt.group(1)}
        if fields["prompt"] == "login":
            fields |= {"login": login, "password": "any"}
        response = browser.post(urljoin(str(response.url), form.group(1)), data=fields)
    pytest.fail(f"the sign-in did not come back to {stop_at}")


def queue_frames(gateway: ThreadedServer, tenant: str, count: int, seed: int = 0) -> None:
    """``count`` frames of ``tenant`` that the simulator judges "review", so they wait in the queue."""
    frames = [make_keyframe("review", 320, 180, seed=seed + n) for n in range(count)]
    answer = httpx.post(f"{gateway.url}/v1/moderations", json={"input": image_input(*frames)},
                        headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=30)
    assert answer.status_code == 200, answer.text
