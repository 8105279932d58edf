"""The operations console's parts that are not HTTP: signed sign-in sessions, CSRF tokens, and the newest
weekly quality report's headline.

Sessions: the cookie holds a signed statement ("alice signed in with admin token 1a2b3c4d at T, valid until
T+ttl"), never the token. The signing key is derived from ``MODGATE_AUTH__ADMIN_TOKEN`` (HMAC with a fixed
label) and the statement names the token's digest, so every replica that shares the token accepts the same
sessions, and rotating the token signs every console user out. Signing out (one session, or everywhere) is
remembered on the server: gateway/http/console/guard.py. The CSRF token is an HMAC of the session id under a
second derived key: the server recomputes it, nothing is stored.

The quality headline is read from the ``quality-YYYY-Www.json`` files ``modgate quality report`` writes,
through the report's own models (:mod:`quality.summaries`, light: no numpy, scikit-learn or matplotlib)
for the parts the console shows (recommendation, trend, costs); the rest of the file is not read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.http.auth import OPERATOR_NAME
from quality.summaries import ArmCost, Decision, Recommendation, WeekSummary

log = logging.getLogger("modgate.console")

_COOKIE_VERSION = "v1"


def _derive(admin_token: str, label: bytes) -> bytes:
    """A purpose-bound key: the admin token never signs anything directly."""
    return hmac.new(admin_token.encode(), b"modgate console " + label, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """One operator signed in to the console."""

    session_id: str  # random per sign-in: what the CSRF token is bound to
    operator: str
    token_id: str  # "admin:1a2b3c4d", as the admin API names the token in the audit trail
    issued_at: float  # Unix seconds
    expires_at: float

    @property
    def actor(self) -> str:
        """The audit trail's name for this operator (the admin API's format, marked as the console)."""
        return f"{self.operator} ({self.token_id}, console)"


class SessionSigner:
    """Issues and reads signed session cookies, and the CSRF token of each session."""

    def __init__(self, admin_token: str, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self._session_key = _derive(admin_token, b"session v1")
        self._csrf_key = _derive(admin_token, b"csrf v1")
        # The session names the token it was signed in with: a rotated token ends it even if a signing key
        # were ever shared between tokens (revocation before that: gateway/http/console/guard.py).
        self._token_digest = hashlib.sha256(admin_token.encode()).hexdigest()[:32]
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, operator: str, token_id: str) -> tuple[ConsoleSession, str]:
        """A new session and its cookie value."""
        if not OPERATOR_NAME.match(operator):
            raise ValueError(f"not an operator name: {operator!r}")
        now = round(self._clock(), 3)  # milliseconds: what the cookie carries
        expires = round(now + self.ttl_s, 3)
        session = ConsoleSession(secrets.token_urlsafe(18), operator, token_id, now, expires)
        claims = {"sid": session.session_id, "op": session.operator, "tid": session.token_id,
                  "tdg": self._token_digest, "iat": session.issued_at, "exp": session.expires_at}
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        return session, f"{_COOKIE_VERSION}.{payload}.{self._sign(payload)}"

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self._session_key, f"{_COOKIE_VERSION}.{payload}".encode(), hashlib.sha256)
        return _b64(mac.digest())

    def read(self, cookie: str | None) -> ConsoleSession | None:
        """The session in a cookie value; None if absent, tampered with, signed by another key or expired."""
        if not cookie:
            return None
        version, _, rest = cookie.partition(".")
        payload, _, signature = rest.partition(".")
        if version != _COOKIE_VERSION or not payload or not signature:
            return None
        if not hmac.compare_digest(self._sign(payload).encode(), signature.encode()):
            return None
        try:
            claims = json.loads(_unb64(payload))
            session = ConsoleSession(str(claims["sid"]), str(claims["op"]), str(claims["tid"]),
                                     float(claims["iat"]), float(claims["exp"]))
        except (binascii.Error, ValueError, KeyError, TypeError):
            return None  # signed by us but unreadable: an older format; sign in again
        if not hmac.compare_digest(str(claims.get("tdg", "")).encode(), self._token_digest.encode()):
            return None  # issued for another admin token
        if session.expires_at <= self._clock():
            return None
        return session

    def csrf_token(self, session: ConsoleSession) -> str:
        """The token the console's forms carry for this session."""
        return _b64(hmac.new(self._csrf_key, session.session_id.encode(), hashlib.sha256).digest())

    def csrf_valid(self, session: ConsoleSession, token: str) -> bool:
        """Whether a form's token was issued for this session (compared in constant time)."""
        # As bytes: compare_digest refuses a str with non-ASCII characters (a forged form may send one).
        return hmac.compare_digest(self.csrf_token(session).encode(), token.encode())


# --- the weekly quality report, as the console shows it -------------------------------------------------

_REPORT_NAME = re.compile(r"^quality-(\d{4}-W\d{2})\.json$")


class _ReportFile(BaseModel):
    """The subset of a ``quality-YYYY-Www.json`` report the console reads; other fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    week: str
    generated_at: datetime
    recommendation: Recommendation
    trend: list[WeekSummary] = []
    costs: list[ArmCost] = []


class QualityHeadline(BaseModel):
    """The newest weekly quality report: its recommendation and the figures behind it."""

    week: str
    generated_at: datetime
    decision: Decision
    title: str
    headline: str
    figures: WeekSummary | None  # None: the report carries no figures for its own week
    costs: dict[str, ArmCost]  # by arm: thinking_on, thinking_off
    html_report: Path | None  # the HTML version beside the JSON, when it was written
    skipped: list[str]  # newer report files that could not be read


def latest_quality_headline(directory: Path) -> QualityHeadline | None:
    """The newest readable ``quality-YYYY-Www.json`` in ``directory`` (None: no report yet).

    Newest by ISO week in the file name, not by modification time: re-running an old week must not make it
    look current. Unreadable newer files are named in ``skipped`` so the console can say so.
    """
    try:
        names = sorted((p.name for p in directory.iterdir() if _REPORT_NAME.match(p.name)), reverse=True)
    except OSError:
        return None  # no directory yet: no report yet
    skipped: list[str] = []
    for name in names:
        path = directory / name
        try:
            report = _ReportFile.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            log.warning("console: skipping unreadable quality report %s: %s", path, exc)
            skipped.append(name)
            continue
        html = path.with_suffix(".html")
        return QualityHeadline(
            week=report.week,
            generated_at=report.generated_at,
            decision=report.recommendation.decision,
            title=report.recommendation.title,
            headline=report.recommendation.headline,
            figures=next((f for f in report.trend if f.week == report.week), None),
            costs={cost.arm: cost for cost in report.costs},
            html_report=html if html.is_file() else None,
            skipped=skipped,
        )
    return None
