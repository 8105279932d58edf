"""The operations console: one server-rendered page at ``/console``, behind the admin token.

It shows the thinking policy (with a switch that needs a reason), the audit trail, the recent window's
figures, the engine's health and the newest weekly quality report, and refreshes its panels every few
seconds from ``GET /console/panels``. Jinja templates and one small script shipped in the package: no
build step, nothing fetched from elsewhere (the Content-Security-Policy says so to the browser).

Who may use it: a browser signs in with the admin token and gets a signed session cookie (HttpOnly,
SameSite=Strict, Secure unless configured off; see gateway/http/console/sessions.py); scripts may send
``Authorization: Bearer <MODGATE_AUTH__ADMIN_TOKEN>`` instead. Forms posted with the cookie carry a
per-session CSRF token, checked here; a request authorised by the header needs none, because browsers never
attach that header on their own. A flip goes through the same policy store call as
``PUT /admin/thinking-policy``, with the reason and the signed-in operator as the actor, and the version the
page showed (409 if another flip came first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import MediaType, Request, Response, get, post
from litestar.datastructures import Cookie, FormMultiDict
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath
from redis.exceptions import RedisError

from gateway.errors import Forbidden, ModgateError, NotFound, StateUnavailable, Unauthorized
from gateway.http.auth import OPERATOR_NAME, KeyRing, operator_name
from gateway.http.console.access import SESSION_COOKIE, console_session, require, session_signer
from gateway.http.console.dashboard import Dashboard
from gateway.http.console.guard import ConsoleGuard
from gateway.http.console.oidc import OidcSignIn
from gateway.http.console.sessions import (
    ConsoleSession,
    Role,
    SessionSigner,
    latest_quality_headline,
)
from gateway.policy.rules import MODES, ThinkingPolicy
from gateway.settings import Settings

log = logging.getLogger("modgate.console")

REASON_MIN, REASON_MAX = 3, 500

# Everything the page loads comes from this gateway; nothing may frame it (the flip is one click).
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# The weekly report is one self-contained file: inline CSS, charts as data: PNGs, no scripts.
_REPORT_HEADERS = {
    **_PAGE_HEADERS,
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
                               "frame-ancestors 'none'; base-uri 'none'",
}
# Litestar adds the charset to text types.
_ASSET_TYPES = {"console.css": "text/css", "console.js": "text/javascript", "review.js": "text/javascript",
                "favicon.svg": "image/svg+xml"}
# Templates and assets ship in the package (package-data), beside this module's package.
_TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
# Read once at import: small files, never changed while the process runs.
_ASSETS = {name: (_TEMPLATE_DIR / name).read_text(encoding="utf-8") for name in _ASSET_TYPES}
_PANELS = ("summary", "policy", "figures", "tenants", "health", "quality", "audit")


# --- formatting for the templates ----------------------------------------------------------------------

def _duration(ms: float | None) -> str:
    """``412 ms`` below two seconds, ``8.56 s`` above; ``–`` when there is nothing to show."""
    if ms is None:
        return "–"
    return f"{ms:,.0f} ms" if ms < 2000 else f"{ms / 1000:,.2f} s"


def _percent(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f} %"


def _number(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _when(moment: datetime | None) -> str:
    return "–" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(seconds: float | None) -> str:
    """``42 s``, ``5 min``, ``3 h``, ``2 d``: the largest whole unit; ``–`` when there is nothing to show."""
    if seconds is None:
        return "–"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f} {unit}"
    return f"{max(0.0, seconds):.0f} s"


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return f"{_age((datetime.now(UTC) - moment).total_seconds())} ago"


def _change(values: dict[str, Any]) -> str:
    def short(value: Any) -> str:
        text = "–" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        return text if len(text) <= 40 else text[:37] + "…"

    return f"{short(values.get('old'))} → {short(values.get('new'))}"


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(_TEMPLATE_DIR),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(duration=_duration, percent=_percent, number=_number, when=_when, ago=_ago,
                       change=_change, age=_age)
    return env


_TEMPLATES = _environment()


def _render(template: str, **context: Any) -> str:
    return _TEMPLATES.get_template(template).render(**context)


# --- who is asking -------------------------------------------------------------------------------------
# Each route names who it lets in by the dependency it takes, resolved before its handler runs (the same
# header checks as the /admin guard, gateway/http/guards.py, plus signed-in sessions): ``operator`` (None
# for a stranger, whom the route answers with its sign-in page; 403 for a reviewer), ``signed_in`` (a
# stranger gets 401), ``person`` (anyone signed in, whatever their role: signing out) or, for the page
# itself, ``visitor``. Which role reaches what: gateway/http/console/access.py.

@dataclass(frozen=True, slots=True)
class _Operator:
    """Who is using the console, and how they proved it."""

    name: str
    actor: str  # the audit trail's name
    session: ConsoleSession | None  # None: the Authorization header (no CSRF token needed or possible)
    role: Role = "operator"  # the admin token's is an operator; a session says which


def _signer(settings: Settings) -> SessionSigner | None:
    """The session signer, or None while admin calls are disabled (no MODGATE_AUTH__ADMIN_TOKEN)."""
    return session_signer(settings)


async def _person(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings], keys: NamedDependency[KeyRing],
    console: NamedDependency[ConsoleGuard],
) -> _Operator | None:
    """The header's admin token (a wrong one is a 401, a business key a 403, as on /admin), else the signed
    session still in force (not signed out, on this replica or another), whatever its role, else None."""
    authorization = request.headers.get("authorization")
    if authorization is not None:
        token_id = await keys.authorize_admin(authorization)
        name = operator_name(request.headers.get("x-modgate-operator"))
        if name is None:
            return _Operator(token_id, f"{token_id} (console)", None)
        return _Operator(name, f"{name} ({token_id}, console)", None)
    session = await console_session(request, settings, console)
    if session is None:
        return None
    return _Operator(session.operator, session.actor, session, session.role)


def _operator(person: NamedDependency[_Operator | None]) -> _Operator | None:
    """The person if they may use the console's pages (None: a stranger); 403 for a reviewer."""
    if person is not None:
        require(person.role, "console")
    return person


def _signed_in(operator: NamedDependency[_Operator | None]) -> _Operator:
    """The operator, or 401 for a stranger (the routes a script polls: no sign-in page)."""
    if operator is None:
        raise Unauthorized(
            "sign in to the console (or send 'Authorization: Bearer <MODGATE_AUTH__ADMIN_TOKEN>')"
        )
    return operator


async def _visitor(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings], keys: NamedDependency[KeyRing],
    console: NamedDependency[ConsoleGuard],
) -> _Operator | None:
    """The page's visitor; None, not a 403, while admin calls are disabled: the page itself says so."""
    if settings.auth.admin_token is None:
        return None
    return await _person(request, settings, keys, console)


OPERATOR = {
    "person": Provide(_person),
    "operator": Provide(_operator, sync_to_thread=False),
    "signed_in": Provide(_signed_in, sync_to_thread=False),
    "visitor": Provide(_visitor),
    "dashboard": Provide(Dashboard, sync_to_thread=False),
}
"""The console routes' dependencies: who is asking, and what the page shows."""


def _field(form: FormMultiDict, name: str) -> str:
    """A text field of a posted form, stripped ("" when absent or a file)."""
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


# --- responses -----------------------------------------------------------------------------------------

def _html(body: str, status: int = 200, cookies: list[Cookie] | None = None,
          headers: dict[str, str] | None = None) -> Response[str]:
    return Response(body, media_type=MediaType.HTML, status_code=status,
                    headers={**_PAGE_HEADERS, **(headers or {})}, cookies=cookies)


def _see_other(location: str, cookies: list[Cookie] | None = None) -> Response[str]:
    """Post/redirect/get: a reload never re-posts a flip."""
    return Response("", status_code=303, headers={**_PAGE_HEADERS, "Location": location}, cookies=cookies)


def _session_cookie(settings: Settings, value: str, max_age: int) -> Cookie:
    # Path "/": the review queue's API (/admin/review/*) takes the console's session too.
    return Cookie(key=SESSION_COOKIE, value=value, path="/", max_age=max_age, httponly=True,
                  secure=settings.console.cookie_secure, samesite="strict")


def _sign_in_page(settings: Settings, oidc: OidcSignIn | None, status: int = 200, error: str | None = None,
                  operator: str = "", cookie_dropped: bool = False,
                  headers: dict[str, str] | None = None) -> Response[str]:
    return _html(_render("sign_in.html", error=error, operator_name=operator, cookie_dropped=cookie_dropped,
                         disabled=settings.auth.admin_token is None,
                         oidc_provider=oidc.provider_name if oidc is not None else None,
                         cookie_secure=settings.console.cookie_secure),
                 status=status, headers=headers)


def _csrf(settings: Settings, operator: _Operator) -> str:
    """The CSRF token the session's forms carry ("" for a caller with the Authorization header)."""
    signer = _signer(settings)
    return signer.csrf_token(operator.session) if signer is not None and operator.session is not None else ""


def _csrf_refused(settings: Settings, operator: _Operator, form: FormMultiDict) -> bool:
    """Whether a form posted with the session cookie lacks its session's CSRF token."""
    signer = _signer(settings)
    return operator.session is not None and (
        signer is None or not signer.csrf_valid(operator.session, _field(form, "csrf"))
    )


async def _dashboard_page(
    dashboard: Dashboard, operator: _Operator, *, status: int = 200, error: str | None = None,
    notice: str | None = None, reason: str = "",
) -> Response[str]:
    view = {**await dashboard.view(), "operator": operator}
    csrf = _csrf(dashboard.settings, operator)
    return _html(_render("dashboard.html", **view, csrf=csrf, error=error, notice=notice, reason=reason,
                         panels=_PANELS), status=status)


# --- routes --------------------------------------------------------------------------------------------

@get("/console", include_in_schema=False)
async def console_page(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings],
    oidc: NamedDependency[OidcSignIn | None], dashboard: NamedDependency[Dashboard],
    visitor: NamedDependency[_Operator | None],
) -> Response[str]:
    """The console, or its sign-in form."""
    if settings.auth.admin_token is None:
        return _sign_in_page(settings, oidc, status=403)
    operator = visitor
    if operator is None:
        # Just signed in, yet no session came back: the browser dropped the cookie (Secure over plain HTTP).
        return _sign_in_page(settings, oidc, cookie_dropped=request.query_params.get("signed_in") == "1")
    if operator.role != "operator" and operator.session is not None:
        if request.query_params.get("signed_in") is not None:
            return _see_other("/console/review")  # a reviewer who just signed in: their page
        signer = _signer(settings)
        csrf = signer.csrf_token(operator.session) if signer is not None else ""
        return _html(_render("refused.html", csrf=csrf, message=(
            f"You are signed in as {operator.name}, a reviewer: the review queue is yours "
            "(/admin/review/*), the operations console is not."
        )), status=403)
    notice = None
    flipped = request.query_params.get("flipped")
    policy = dashboard.policies.current()
    if flipped is not None and flipped == str(policy.version):
        notice = f"Version {policy.version} is in force: thinking {policy.default_mode.upper()} by default."
    elif request.query_params.get("unchanged") is not None:
        notice = f"Thinking was already {policy.default_mode.upper()}: nothing changed, nothing audited."
    return await _dashboard_page(dashboard, operator, notice=notice)


@post("/console/sign-in", include_in_schema=False)
async def console_sign_in(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings], keys: NamedDependency[KeyRing],
    console: NamedDependency[ConsoleGuard], oidc: NamedDependency[OidcSignIn | None],
) -> Response[str]:
    """Check the admin token from the form and set the signed session cookie; too many failures: 429."""
    signer = _signer(settings)
    if signer is None:
        return _sign_in_page(settings, oidc, status=403)
    where = request.client.host if request.client else "unknown"
    limiter = console.limiter
    wait_s = await limiter.retry_after(where)
    if wait_s is not None:  # even the right token: guessing must gain nothing while the limit holds
        log.warning("console: sign-in refused for %d s after repeated failures (from %s)", wait_s, where)
        return _sign_in_page(
            settings, oidc, 429, f"Too many failed sign-ins: try again in {wait_s} s.",
            headers={"Retry-After": str(wait_s)},
        )
    form = await request.form()
    name, token = _field(form, "operator"), _field(form, "token")
    if not OPERATOR_NAME.match(name):
        return _sign_in_page(
            settings, oidc, 400, "Your name goes into the audit trail: 1-64 letters, digits or _ . @ -", name
        )
    try:
        token_id = await keys.authorize_admin(f"Bearer {token}")
    except (Unauthorized, Forbidden) as exc:
        await limiter.failed(where)
        log.warning("console: failed sign-in as %r from %s", name, where)
        if isinstance(exc, Forbidden):
            refusal = "That is a business API key: it cannot open the console."
            return _sign_in_page(settings, oidc, 403, refusal, name)
        return _sign_in_page(settings, oidc, 401, "That is not the admin token.", name)
    await limiter.succeeded(where)
    _, value = signer.issue(name, token_id)
    log.info("console: %s signed in (%s)", name, token_id)
    cookie = _session_cookie(settings, value, int(signer.ttl_s))
    return _see_other("/console?signed_in=1", cookies=[cookie])


@post("/console/sign-out", include_in_schema=False)
async def console_sign_out(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings],
    console: NamedDependency[ConsoleGuard], person: NamedDependency[_Operator | None],
) -> Response[str]:
    """End this session on the server (wherever a copy of its cookie went) and forget the cookie."""
    form = await request.form()
    signer = _signer(settings)
    if person is not None and person.session is not None and signer is not None and not signer.csrf_valid(
        person.session, _field(form, "csrf")
    ):
        refusal = "This sign-out did not come from the console's own page."
        return _html(_render("refused.html", message=refusal), status=403)
    if person is not None and person.session is not None:
        try:
            await console.revocations.revoke(person.session)
        except RedisError as exc:
            return _html(_render("refused.html", message=(
                f"Not signed out on the server: the session store (Redis) is unreachable ({exc}). Try again."
            )), status=503)
        log.info("console: %s signed out", person.actor)
    return _see_other("/console", cookies=[_session_cookie(settings, "", 0)])


@post("/console/sign-out-everywhere", include_in_schema=False)
async def console_sign_out_everywhere(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings],
    console: NamedDependency[ConsoleGuard], oidc: NamedDependency[OidcSignIn | None],
    operator: NamedDependency[_Operator | None],
) -> Response[Any]:
    """End every console session issued until now, on every replica (a lost laptop, a departing operator).

    From the page (session and CSRF token) or a script
    (``Authorization: Bearer <MODGATE_AUTH__ADMIN_TOKEN>``).
    """
    if operator is None:
        return _sign_in_page(settings, oidc, 401, "Sign in to sign everyone out.")
    form = await request.form()
    if _csrf_refused(settings, operator, form):
        refusal = "This sign-out did not come from the console's own page."
        return _html(_render("refused.html", message=refusal), status=403)
    now = time.time()
    try:
        await console.revocations.revoke_all(now)
    except RedisError as exc:
        raise StateUnavailable(
            f"cannot sign everyone out: the session store (Redis) is unreachable ({exc})"
        ) from exc
    log.warning("console: every session issued until now was ended by %s", operator.actor)
    if operator.session is None:
        return Response({"signed_out_before": now}, status_code=200, headers=_PAGE_HEADERS)
    return _see_other("/console", cookies=[_session_cookie(settings, "", 0)])


@post("/console/thinking", include_in_schema=False)
async def console_flip_thinking(
    request: Request[Any, Any, Any], oidc: NamedDependency[OidcSignIn | None],
    dashboard: NamedDependency[Dashboard], operator: NamedDependency[_Operator | None],
) -> Response[str]:
    """Set the default thinking mode, with a reason, the version the page showed and the CSRF token."""
    settings, policies = dashboard.settings, dashboard.policies
    if operator is None:
        return _sign_in_page(settings, oidc, 401, "Sign in to change the thinking policy.")
    form = await request.form()
    reason = _field(form, "reason")
    if _csrf_refused(settings, operator, form):
        log.warning("console: refused a flip without a valid CSRF token (session of %s)", operator.name)
        return await _dashboard_page(dashboard, operator, status=403, reason=reason, error=(
            "Refused: this form did not come from this console session. Nothing changed; reload the page."
        ))
    mode = _field(form, "mode")
    if mode not in MODES:
        return await _dashboard_page(dashboard, operator, status=400, reason=reason,
                                error="Choose a mode: on, off or escalate.")
    if not REASON_MIN <= len(reason) <= REASON_MAX:
        return await _dashboard_page(dashboard, operator, status=400, reason=reason, error=(
            f"A reason ({REASON_MIN}-{REASON_MAX} characters) is required: it goes into the audit trail. "
            "Nothing changed."
        ))
    version_text = _field(form, "version")
    if not version_text.isdigit():
        return await _dashboard_page(dashboard, operator, status=400, reason=reason,
                                error="The form lost the policy version it was made from: reload the page.")
    current = policies.current()
    try:
        update = await policies.replace(
            current.model_copy(update={"default_mode": mode}), operator.actor, reason, int(version_text)
        )
    except ModgateError as exc:  # 409 another flip came first, 503 Redis down: say so, keep the reason typed
        return await _dashboard_page(dashboard, operator, status=exc.status, reason=reason,
                                error=f"Not changed: {exc.message}")
    if not update.changed:
        return _see_other("/console?unchanged=1")
    log.warning("thinking policy version %d by %s: default %s: %s",
                update.policy.version, operator.actor, mode, reason)
    return _see_other(f"/console?flipped={update.policy.version}")


@get("/console/panels", include_in_schema=False)
async def console_panels(
    dashboard: NamedDependency[Dashboard], signed_in: NamedDependency[_Operator]
) -> Response[dict[str, Any]]:
    """The page's panels rendered now, for the page to swap in (and the policy version, to spot a flip)."""
    view = {**await dashboard.view(), "operator": signed_in}
    panels = {name: _render(f"_{name}.html", **view) for name in _PANELS}
    policy: ThinkingPolicy = view["policy"]
    body = {"policy_version": policy.version, "default_mode": policy.default_mode, "panels": panels}
    return Response(body, headers=_PAGE_HEADERS)


@get("/console/quality/latest", include_in_schema=False)
async def console_quality_report(
    settings: NamedDependency[Settings], signed_in: NamedDependency[_Operator]
) -> Response[bytes]:
    """The newest weekly quality report's HTML file, as ``modgate quality report`` wrote it (``signed_in``: an
    operator's only)."""
    quality = await asyncio.to_thread(latest_quality_headline, settings.console.reports_dir)
    if quality is None or quality.html_report is None:
        raise NotFound(f"no HTML quality report in {settings.console.reports_dir}",
                       code="no_quality_report")
    body = await asyncio.to_thread(quality.html_report.read_bytes)
    return Response(body, media_type=MediaType.HTML, headers=_REPORT_HEADERS)


@get("/console/assets/{name:str}", include_in_schema=False)
async def console_asset(name: FromPath[str]) -> Response[str]:
    """The page's stylesheet and script, shipped beside its templates."""
    if name not in _ASSETS:
        raise NotFound(f"no console asset {name!r}")
    return Response(_ASSETS[name], media_type=_ASSET_TYPES[name],
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


ROUTES = [console_page, console_sign_in, console_sign_out, console_sign_out_everywhere, console_flip_thinking,
          console_panels, console_quality_report, console_asset]
