"""Operators' calls: the thinking policy. Every call needs the admin token; every change a reason."""

from __future__ import annotations

import logging
from typing import Any

from litestar.di import NamedDependency
from litestar import Request, get, put
from pydantic import ValidationError

from gateway.errors import InvalidRequest
from gateway.policy import ThinkingPolicy
from gateway.services import Services

log = logging.getLogger("modgate.admin")


@get("/admin/thinking-policy")
async def get_thinking_policy(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> dict[str, Any]:
    """The policy document in force."""
    services.keys.admin(request.headers.get("authorization"))
    return services.policies.current().model_dump(mode="json")


@put("/admin/thinking-policy")
async def put_thinking_policy(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> dict[str, Any]:
    """Replace the policy document; the body is the whole document plus a ``reason``."""
    actor = services.keys.admin(request.headers.get("authorization"))
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    reason = body.pop("reason", None)
    if not isinstance(reason, str) or len(reason.strip()) < 3:
        raise InvalidRequest("a 'reason' (at least 3 characters) is required for every policy change", param="reason")
    for bookkeeping in ("version", "updated_at", "updated_by"):
        body.pop(bookkeeping, None)
    try:
        policy = ThinkingPolicy.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidRequest(f"invalid policy: {where}: {first['msg']}", param=where) from exc
    new = await services.policies.replace(policy, actor, reason.strip())
    log.info("thinking policy changed to version %s by %s: %s", new.version, actor, reason.strip())
    return new.model_dump(mode="json")


ROUTES = [get_thinking_policy, put_thinking_policy]
