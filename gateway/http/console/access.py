"""Who a console session is, and where its role lets it in.

A browser signed in to the console (with the admin token, or as themselves through OpenID Connect) holds
one signed session cookie (gateway/http/console/sessions.py), sent to the console and to the review
queue's API. Two roles:

- ``operator``: the console, its changes, and the review queue for every tenant (what the admin token's
  console session does);
- ``reviewer``: the review queue (``/admin/review/*`` and the console's review page) for their own tenants
  only; every other console page and ``/admin`` route answers them 403.

:func:`allowed` is the one place that says so; the console routes, the ``/admin`` guard and the review
queue's guard ask it. A request authorised by the session cookie changes nothing without the session's
CSRF token (a form field on the console's forms, the ``X-Modgate-CSRF`` header on API calls).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from litestar.connection import ASGIConnection

from gateway.errors import Forbidden
from gateway.http.console.guard import ConsoleGuard
from gateway.http.console.sessions import ConsoleSession, Role, SessionSigner
from gateway.settings import Settings

SESSION_COOKIE: Final = "modgate_console"
CSRF_HEADER: Final = "x-modgate-csrf"
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})

Area = Literal["console", "admin", "review"]
"""What a request reaches: the console's pages, the ``/admin`` API, or the review queue (API and page)."""


def allowed(role: Role, area: Area) -> bool:
    """Whether a role may reach an area: an operator everywhere, a reviewer the review queue only."""
    return role == "operator" or area == "review"


def require(role: Role, area: Area) -> None:
    """403 (the OpenAI error shape) unless the role may reach the area."""
    if not allowed(role, area):
        raise Forbidden(
            "a reviewer may use the review queue only (/admin/review/* and the console's review page)",
            code="reviewer_not_allowed",
        )


def session_signer(settings: Settings) -> SessionSigner | None:
    """The session signer, or None while admin calls are disabled (no MODGATE_AUTH__ADMIN_TOKEN)."""
    token = settings.auth.admin_token
    return None if token is None else SessionSigner(token, settings.console.session_ttl_s)


async def console_session(
    connection: ASGIConnection[Any, Any, Any, Any], settings: Settings, console: ConsoleGuard
) -> ConsoleSession | None:
    """The signed session the request's cookie carries, still in force (not signed out on any replica)."""
    signer = session_signer(settings)
    session = None if signer is None else signer.read(connection.cookies.get(SESSION_COOKIE))
    if session is None or not await console.session_in_force(session):
        return None
    return session


def csrf_checked(connection: ASGIConnection[Any, Any, Any, Any], settings: Settings,
                 session: ConsoleSession) -> None:
    """403 for a change (any method but GET, HEAD, OPTIONS) without the session's CSRF token in the
    ``X-Modgate-CSRF`` header: a browser sends the cookie on its own, never this header."""
    if connection.scope.get("method", "GET") in SAFE_METHODS:
        return
    signer = session_signer(settings)
    token = connection.headers.get(CSRF_HEADER, "")
    if signer is None or not signer.csrf_valid(session, token):
        raise Forbidden(
            "a change made with the console's session needs its CSRF token in the X-Modgate-CSRF header",
            code="csrf_token_invalid",
        )
