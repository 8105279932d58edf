"""The console's OpenID Connect sign-in routes: ``/console/oidc/start`` sends the browser to the provider,
``/console/oidc/callback`` takes its answer and signs the person in (gateway/http/console/oidc.py).

Between the two, the flow's state, nonce and PKCE verifier wait in a signed cookie of their own (path
``/console/oidc``, ten minutes, SameSite=Lax: the provider's redirect back is a cross-site navigation, which
a Strict cookie would miss). The session cookie is then the console's usual one, naming the person, their
role and their tenants. The callback answers a small page that moves on to ``/console`` by itself
(``Refresh``), not a redirect: after the provider's cross-site redirect a browser would not send the new
SameSite=Strict session cookie along; a navigation started by the console's own page does.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from litestar import Request, Response, get
from litestar.datastructures import Cookie
from litestar.di import NamedDependency

from gateway.errors import NotFound
from gateway.http.console.guard import ConsoleGuard
from gateway.http.console.oidc import OidcSignIn, SignInFailed
from gateway.http.console.routes import _html, _render, _see_other, _session_cookie, _sign_in_page, _signer
from gateway.http.console.sessions import FLOW_TTL_S
from gateway.settings import Settings

log = logging.getLogger("modgate.console")

FLOW_COOKIE: Final = "modgate_oidc_flow"
_FLOW_PATH: Final = "/console/oidc"


def _flow_cookie(settings: Settings, value: str, max_age: int) -> Cookie:
    return Cookie(key=FLOW_COOKIE, value=value, path=_FLOW_PATH, max_age=max_age, httponly=True,
                  secure=settings.console.cookie_secure, samesite="lax")


@get("/console/oidc/start", include_in_schema=False)
async def oidc_start(
    settings: NamedDependency[Settings], oidc: NamedDependency[OidcSignIn | None]
) -> Response[str]:
    """Begin a sign-in at the provider: 303 to its authorization endpoint, the flow in its cookie."""
    signer = _signer(settings)
    if oidc is None or signer is None:
        raise NotFound("OpenID Connect sign-in is off: set MODGATE_OIDC__ISSUER", code="oidc_off")
    try:
        start = await oidc.begin()
    except SignInFailed as exc:
        return _sign_in_page(settings, oidc, exc.status, exc.message)
    flow = _flow_cookie(settings, signer.seal_flow(start.flow), int(FLOW_TTL_S))
    return _see_other(start.url, cookies=[flow])


@get("/console/oidc/callback", include_in_schema=False)
async def oidc_callback(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings],
    oidc: NamedDependency[OidcSignIn | None], console: NamedDependency[ConsoleGuard],
) -> Response[str]:
    """The provider's answer: check it, and sign the person in with their role and tenants. Refusals count
    toward the sign-in limit as the token form's do (a provider that failed, 502, does not)."""
    signer = _signer(settings)
    if oidc is None or signer is None:
        raise NotFound("OpenID Connect sign-in is off: set MODGATE_OIDC__ISSUER", code="oidc_off")
    where = request.client.host if request.client else "unknown"
    limiter = console.limiter
    wait_s = await limiter.retry_after(where)
    if wait_s is not None:  # even the provider's real answer: guessing codes must gain nothing meanwhile
        log.warning("console: OpenID sign-in refused for %d s after repeated failures (from %s)", wait_s,
                    where)
        return _sign_in_page(settings, oidc, 429, f"Too many failed sign-ins: try again in {wait_s} s.",
                             headers={"Retry-After": str(wait_s)})
    flow = signer.open_flow(request.cookies.get(FLOW_COOKIE))
    if flow is None:
        await limiter.failed(where)
        return _sign_in_page(settings, oidc, 400,
                             "This sign-in expired or began in another browser: start again.")
    try:
        person = await oidc.finish(dict(request.query_params), flow)
    except SignInFailed as exc:
        if exc.status < 500:
            await limiter.failed(where)
        return _sign_in_page(settings, oidc, exc.status, exc.message)
    await limiter.succeeded(where)
    _, value = signer.issue(person.name, person.token_id, person.role, person.tenants)
    log.info("console: %s (%s) signed in with OpenID Connect as %s%s", person.name, person.token_id,
             person.role, "" if person.tenants is None else f" of {sorted(person.tenants)}")
    cookies = [_session_cookie(settings, value, int(signer.ttl_s)), _flow_cookie(settings, "", 0)]
    home = "/console" if person.role == "operator" else "/console/review"  # a reviewer's page is the queue
    page = _render("signed_in.html", name=person.name, role=person.role, home=home)
    return _html(page, cookies=cookies, headers={"Refresh": f"0; url={home}?signed_in=1"})


ROUTES = [oidc_start, oidc_callback]
