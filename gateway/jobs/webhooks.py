"""Signed webhooks: the job's result POSTed to the caller's URL, retried with back-off, at least once."""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Final

import httpx
import stamina

SIGNATURE_HEADER: Final = "X-Modgate-Signature"
DELIVERY_HEADER: Final = "X-Modgate-Delivery"


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """``t=<unix>,v1=<hex HMAC-SHA256 of "<t>." + body>``: the value of ``X-Modgate-Signature``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify_webhook(
    secret: str, header: str, body: bytes, *, tolerance_s: int = 300, now: float | None = None
) -> bool:
    """What a receiver does: the signature matches the body, and its timestamp is recent (no replays)."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    timestamp, given = parts.get("t", ""), parts.get("v1", "")
    if not timestamp.isdigit() or not given:
        return False
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance_s:
        return False
    expected = sign_webhook(secret, int(timestamp), body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given)


class _RetryableStatus(Exception):
    """A webhook answer worth retrying (408, 429, 5xx)."""


class WebhookFailed(Exception):
    """The receiver did not take the webhook after every attempt."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class WebhookSender:
    """Posts signed job results, retrying transport errors and 408/429/5xx with jittered back-off."""

    def __init__(
        self,
        secret: str,
        *,
        timeout_s: float,
        attempts: int,
        wait_initial_s: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._secret = secret
        self.attempts = attempts
        self.wait_initial_s = wait_initial_s
        self._http = httpx.AsyncClient(
            timeout=timeout_s, transport=transport, trust_env=False, follow_redirects=False
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def deliver(self, url: str, body: bytes, delivery_id: str, event: str = "job.finished") -> int:
        """Post ``body`` to ``url``; answers the attempts it took, or raises :class:`WebhookFailed`.

        ``event`` (``X-Modgate-Event``): ``job.finished``; ``job.reviewed`` once a person labelled a frame."""
        tried = 0
        try:
            async for attempt in stamina.retry_context(
                on=(httpx.TransportError, _RetryableStatus),
                attempts=self.attempts,
                wait_initial=self.wait_initial_s,
                wait_max=30.0,
                wait_jitter=self.wait_initial_s,
                timeout=None,
            ):
                with attempt:
                    tried += 1
                    response = await self._http.post(
                        url,
                        content=body,
                        headers={
                            "Content-Type": "application/json",
                            "User-Agent": "modgate-webhook",
                            SIGNATURE_HEADER: sign_webhook(self._secret, int(time.time()), body),
                            DELIVERY_HEADER: delivery_id,
                            "X-Modgate-Event": event,
                        },
                    )
                    if response.status_code in (408, 429) or response.status_code >= 500:
                        raise _RetryableStatus(f"the receiver answered {response.status_code}")
                    if response.status_code >= 300:
                        raise WebhookFailed(
                            f"the receiver refused the webhook ({response.status_code})", tried
                        )
        except (httpx.TransportError, _RetryableStatus) as exc:
            raise WebhookFailed(f"the webhook was not delivered: {exc!r}", tried) from exc
        return tried
