"""Who may call a route: Litestar guards that check the caller once, and the providers that hand it on.

- :func:`business_key` guards ``/v1/…``: an API key (the settings' keys, then the Redis key store; none is
  needed while no key is configured), or 401. The handler receives the :class:`Caller` as ``caller``.
- :func:`admin_token` guards ``/admin/…``: the admin token, or 401 (403 for a business key, for a reviewer
  signed in to the console, or while admin calls are disabled); then ``X-Modgate-Operator`` is checked
  (400). The handler receives the audit trail's name as ``actor``. The review queue's routes have a guard
  of their own that also takes the console's session (gateway/http/routes/review.py).

Both are declared on the routers in gateway/http/app.py. The console also admits signed-in sessions, and
each of its pages answers a stranger its own way, so it asks through a dependency of its own
(gateway/http/console/routes.py), with the same token checks for the header.

A guard runs before the body is read: a caller without a valid key gets 401 (or 403) whatever its body
holds, so it learns nothing from the body's checks, and a refused call costs no body parsing.
"""

from __future__ import annotations

from typing import Any, Final

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.handlers import BaseRouteHandler

from gateway.caller import Caller
from gateway.http.auth import operator_name
from gateway.http.console.access import console_session, require
from gateway.http.providers import services_of

# Where a guard leaves what it found, in the request's scope state, for the providers below.
_CALLER: Final = "modgate.caller"
_ACTOR: Final = "modgate.actor"


async def business_key(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """A business call: the tenant behind its API key, or 401 (503 when the key store cannot be asked)."""
    keys = services_of(connection.app).keys
    connection.state[_CALLER] = await keys.authenticate(connection.headers.get("authorization"))


async def admin_token(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """An admin call: the admin token (401, 403), and a name for the audit trail (the operator's, if sent,
    and the token's id)."""
    services = services_of(connection.app)
    authorization = connection.headers.get("authorization")
    if authorization is None:  # a reviewer's console session is known, and not allowed here: 403, not 401
        session = await console_session(connection, services.settings, services.console)
        if session is not None:
            require(session.role, "admin")
    token_id = await services.keys.authorize_admin(authorization)
    operator = operator_name(connection.headers.get("x-modgate-operator"))
    connection.state[_ACTOR] = token_id if operator is None else f"{operator} ({token_id})"


def _caller(request: Request[Any, Any, Any]) -> Caller:
    caller: Caller = request.state[_CALLER]
    return caller


def caller_of(request: Request[Any, Any, Any]) -> Caller:
    """The caller the business-key guard found (for a hook that answers before the handler's providers)."""
    return _caller(request)


def _actor(request: Request[Any, Any, Any]) -> str:
    actor: str = request.state[_ACTOR]
    return actor


CALLER: Final = {"caller": Provide(_caller, sync_to_thread=False)}
"""The ``caller`` dependency of routes behind :func:`business_key`."""
ACTOR: Final = {"actor": Provide(_actor, sync_to_thread=False)}
"""The ``actor`` dependency of routes behind :func:`admin_token`."""
