"""The operations console's parts that are not HTTP: signed sign-in sessions, CSRF tokens, and the newest
weekly quality report's headline.

Sessions: the cookie holds a signed statement ("alice signed in with admin token 1a2b3c4d at T, valid until
T+ttl"), never the token. The signing key is derived from ``MODGATE_AUTH__ADMIN_TOKEN`` (HMAC with a fixed
label) and the statement names the token's digest, so every replica that shares the token accepts the same
sessions, and rotating the token signs every console user out. Signing out (one session, or everywhere) is
remembered on the server: gateway/http/console/guard.py. The CSRF token is an HMAC of the session id under a
second derived key: the server recomputes it, nothing is stored.

The quality headline is read from the ``quality-YYYY-Www.json`` files ``modgate quality report`` writes,
through the report's own models (:mod:`contracts.summaries`, light: no numpy, scikit-learn or matplotlib)
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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from contracts.summaries import ArmCost, Decision, Recommendation, WeekSummary
from gateway.http.auth import OPERATOR_NAME

log = logging.getLogger("modgate.console")

_COOKIE_VERSION = "v1"
FLOW_TTL_S = 600.0  # an OpenID Connect sign-in not finished within this starts again

Role = Literal["operator", "reviewer"]
"""What a console session may do: an operator everything the admin token's console does; a reviewer only
the review queue, and only their own tenants' items (gateway/http/console/access.py)."""


def _derive(admin_token: str, label: bytes) -> bytes:
    """A purpose-bound key: the admin token never signs anything directly."""
    return hmac.new(admin_token.encode(), b"modgate console " + label, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, f"{_COOKIE_VERSION}.{payload}".encode(), hashlib.sha256).digest())


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """One operator signed in to the console."""

    session_id: str  # random per sign-in: what the CSRF token is bound to
    operator: str
    token_id: str  # "admin:1a2b3c4d", as the admin API names the token in the audit trail
    issued_at: float  # Unix seconds
    expires_at: float
    role: Role = "operator"  # an admin-token sign-in is an operator; OpenID Connect says which
    tenants: frozenset[str] | None = None  # a reviewer's tenants; None: every tenant (an operator)

    @property
    def actor(self) -> str:
        """The audit trail's name for this operator (the admin API's format, marked as the console)."""
        return f"{self.operator} ({self.token_id}, console)"

    @property
    def reviewer_name(self) -> str:
        """The review queue's name for this person: as the admin API names a reviewer (``alice (admin:…)``),
        or ``rita@example.com (oidc:<subject>)``."""
        return f"{self.operator} ({self.token_id})"


class SessionSigner:
    """Issues and reads signed session cookies, and the CSRF token of each session."""

    def __init__(self, admin_token: str, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self._session_key = _derive(admin_token, b"session v1")
        self._csrf_key = _derive(admin_token, b"csrf v1")
        self._flow_key = _derive(admin_token, b"oidc flow v1")
        # The session names the token it was signed in with: a rotated token ends it even if a signing key
        # were ever shared between tokens (revocation before that: gateway/http/console/guard.py).
        self._token_digest = hashlib.sha256(admin_token.encode()).hexdigest()[:32]
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(
        self, operator: str, token_id: str, role: Role = "operator", tenants: frozenset[str] | None = None
    ) -> tuple[ConsoleSession, str]:
        """A new session and its cookie value (a reviewer always with a set of tenants, perhaps empty)."""
        if not OPERATOR_NAME.match(operator):
            raise ValueError(f"not an operator name: {operator!r}")
        if role == "reviewer" and tenants is None:
            raise ValueError("a reviewer's session names their tenants")
        now = round(self._clock(), 3)  # milliseconds: what the cookie carries
        expires = round(now + self.ttl_s, 3)
        session = ConsoleSession(secrets.token_urlsafe(18), operator, token_id, now, expires, role, tenants)
        claims: dict[str, Any] = {
            "sid": session.session_id, "op": session.operator, "tid": session.token_id,
            "tdg": self._token_digest, "iat": session.issued_at, "exp": session.expires_at, "role": role,
        }
        if tenants is not None:
            claims["ten"] = sorted(tenants)
        return session, self._seal(claims, self._session_key)

    @staticmethod
    def _seal(claims: dict[str, Any], key: bytes) -> str:
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        return f"{_COOKIE_VERSION}.{payload}.{_mac(key, payload)}"

    @staticmethod
    def _open(value: str | None, key: bytes) -> dict[str, Any] | None:
        """The claims of a sealed value; None if absent, tampered with or signed by another key."""
        if not value:
            return None
        version, _, rest = value.partition(".")
        payload, _, signature = rest.partition(".")
        if version != _COOKIE_VERSION or not payload or not signature:
            return None
        if not hmac.compare_digest(_mac(key, payload).encode(), signature.encode()):
            return None
        try:
            claims = json.loads(_unb64(payload))
        except (binascii.Error, ValueError):
            return None
        return claims if isinstance(claims, dict) else None

    def _sign(self, payload: str) -> str:
        """A session payload's signature."""
        return _mac(self._session_key, payload)

    def read(self, cookie: str | None) -> ConsoleSession | None:
        """The session in a cookie value; None if absent, tampered with, signed by another key or expired."""
        claims = self._open(cookie, self._session_key)
        if claims is None:
            return None
        role = claims.get("role", "operator")  # sessions issued before roles: the admin token's
        tenants = claims.get("ten")
        try:
            if role not in ("operator", "reviewer") or (role == "reviewer" and not isinstance(tenants, list)):
                raise ValueError(f"no such role: {role!r}")
            session = ConsoleSession(str(claims["sid"]), str(claims["op"]), str(claims["tid"]),
                                     float(claims["iat"]), float(claims["exp"]), role,
                                     None if tenants is None else frozenset(map(str, tenants)))
        except (ValueError, KeyError, TypeError):
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

    def seal_flow(self, claims: dict[str, Any]) -> str:
        """A sign-in in progress (OpenID Connect's state, nonce and PKCE verifier) as a signed cookie value,
        valid for ``FLOW_TTL_S``."""
        return self._seal({**claims, "exp": self._clock() + FLOW_TTL_S}, self._flow_key)

    def open_flow(self, value: str | None) -> dict[str, Any] | None:
        """The claims :meth:`seal_flow` sealed; None if absent, tampered with or expired."""
        claims = self._open(value, self._flow_key)
        if claims is None or not isinstance(claims.get("exp"), float) or claims["exp"] <= self._clock():
            return None
        return claims


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
