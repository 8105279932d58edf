"""Operators' calls: the thinking policy, its history and the audit trail.

Every call needs the admin token (never a business key), checked by the router's guard
(gateway/http/guards.py); every change needs a reason and is audited under the ``actor`` the guard names.
``X-Modgate-Operator: <name>`` says who is behind the shared token (``modgate policy`` sends ``$USER``).
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, TypeVar

from litestar import Request, Response, get, post, put, route
from litestar.di import NamedDependency
from litestar.enums import HttpMethod
from litestar.exceptions import SerializationException
from litestar.params import JSONBody, Parameter
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import InvalidRequest, UnprocessableRequest
from gateway.http.json_body import integral_numbers, validate_json_body
from gateway.http.routes import responses
from gateway.http.routes.responses import error_responses
from gateway.policy.moderation import ModerationPolicy
from gateway.policy.rules import PolicyStore, ThinkingPolicy

log = logging.getLogger("modgate.admin")

# Fields the gateway fills in or shows alongside the document: never part of what a PUT decides.
_SHOWN_ONLY = ("updated_at", "updated_by", "content_hash", "store", "changed")

Limit = Annotated[int, Parameter(ge=1, le=1000)]
# A reason: at least 3 characters once surrounding white space is stripped (``_reason``)
# The white space of JSON Schema's (ECMA-262's) \s, spelled out: Python's str.strip() also strips the
# control characters \x1c-\x1f and \x85, which the published pattern counts as text (schemathesis found a
# schema-valid reason of control characters refused). The pattern and the check below use this one set.
_SPACE_CLASS = r"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_SPACE = "".join(
    ("\t\n\v\f\r \u00a0\u1680", *map(chr, range(0x2000, 0x200B)), "\u2028\u2029\u202f\u205f\u3000\ufeff")
)
REASON_PATTERN = rf"^[{_SPACE_CLASS}]*[^{_SPACE_CLASS}][\s\S]+[^{_SPACE_CLASS}][{_SPACE_CLASS}]*$"


def _reason(value: object) -> str:
    """The change's reason without its surrounding white space, as the published pattern reads it."""
    reason = value.strip(_SPACE) if isinstance(value, str) else ""
    if len(reason) < 3:
        raise InvalidRequest("a 'reason' (at least 3 characters) is required for every policy change",
                             param="reason")
    return reason


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], body: dict[str, Any]) -> M:
    """``body`` as ``model`` (JSON's own types), or a 4xx naming the first field that is wrong."""
    try:
        return validate_json_body(model, body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        # a model validator's rule (between fields) is no schema's: the document accepted the body
        rule_only = all(error["type"] == "value_error" for error in exc.errors())
        refused = UnprocessableRequest if rule_only else InvalidRequest
        raise refused(f"invalid policy: {where}: {first['msg']}", param=where or None) from exc


async def _policy_change(request: Request[Any, Any, Any]) -> tuple[dict[str, Any], str, int | None]:
    """A PUT's body (a JSON object), its ``reason`` and the ``version`` it was made from, popped off."""
    try:
        body = await request.json()
    except (ValueError, SerializationException) as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    body = integral_numbers(body)  # 2.0 is an integer to JSON Schema: a version of 2.0 is version 2
    reason = _reason(body.pop("reason", None))
    expected_version = body.pop("version", None)
    if expected_version is not None and (type(expected_version) is not int or expected_version < 1):
        raise InvalidRequest("'version' must be the version the change was made from (an integer)",
                             param="version")
    for shown_only in _SHOWN_ONLY:
        body.pop(shown_only, None)
    return body, reason, expected_version


def policy_view(policy: ThinkingPolicy, policies: PolicyStore) -> dict[str, Any]:
    """The document as operators see it: its fields, its content hash and where it came from."""
    document: dict[str, Any] = json.loads(policy.model_dump_json())
    return {**document, "content_hash": policy.content_hash(),
            "store": policies.status().model_dump(mode="json")}


@route("/admin/thinking-policy", http_method=[HttpMethod.OPTIONS], include_in_schema=False)
async def thinking_policy_options(request: Request[Any, Any, Any]) -> Response[None]:
    """``Allow`` naming every method of the path. Litestar's own OPTIONS answer, made when the path's first
    method is registered, names only that one (GET), so this handler comes first and answers for all."""
    methods = request.app.route_handler_method_map[request.scope["path_template"]]
    return Response(None, status_code=204, headers={"Allow": ", ".join(sorted(methods))})


@get("/admin/thinking-policy", responses=error_responses(responses.ADMIN_READ))
async def get_thinking_policy(policies: NamedDependency[PolicyStore]) -> dict[str, Any]:
    """The policy document in force on this replica, its content hash and the store's state."""
    return policy_view(policies.current(), policies)


@put("/admin/thinking-policy", responses=error_responses(responses.ADMIN_CHANGE))
async def put_thinking_policy(
    request: Request[Any, Any, Any], policies: NamedDependency[PolicyStore], actor: NamedDependency[str]
) -> dict[str, Any]:
    """Replace the policy document; the body is the whole document plus a ``reason``.

    A ``version`` in the body is the version the change was made from: if another flip came first the
    answer is 409 instead of silently overwriting it. Without one, the change applies to whatever is in force.
    """
    body, reason, expected_version = await _policy_change(request)
    policy = _validated(ThinkingPolicy, body)
    if "moderation" in body:
        update = await policies.replace(policy, actor, reason, expected_version)
    else:  # a thinking document without the moderation policy keeps the one in force
        update = await policies.amend(
            lambda current: policy.model_copy(update={"moderation": current.moderation}),
            actor, reason, expected_version,
        )
    if update.changed:
        log.warning("thinking policy version %d by %s: %s", update.policy.version, actor, reason)
    return {**policy_view(update.policy, policies), "changed": update.changed}


def moderation_view(policy: ThinkingPolicy, policies: PolicyStore) -> dict[str, Any]:
    """The moderation policy as operators see it: the shared document's version, its default and tenants."""
    document: dict[str, Any] = json.loads(policy.moderation.model_dump_json())
    updated_at = policy.updated_at.isoformat() if policy.updated_at else None
    return {"version": policy.version, **document, "updated_at": updated_at, "updated_by": policy.updated_by,
            "store": policies.status().model_dump(mode="json")}


@route("/admin/moderation-policy", http_method=[HttpMethod.OPTIONS], include_in_schema=False)
async def moderation_policy_options(request: Request[Any, Any, Any]) -> Response[None]:
    """``Allow`` naming every method of the path (see :func:`thinking_policy_options`)."""
    methods = request.app.route_handler_method_map[request.scope["path_template"]]
    return Response(None, status_code=204, headers={"Allow": ", ".join(sorted(methods))})


@get("/admin/moderation-policy", responses=error_responses(responses.ADMIN_READ))
async def get_moderation_policy(policies: NamedDependency[PolicyStore]) -> dict[str, Any]:
    """Each tenant's moderation policy and the default, under the policy document's version."""
    return moderation_view(policies.current(), policies)


@put("/admin/moderation-policy", responses=error_responses(responses.ADMIN_CHANGE))
async def put_moderation_policy(
    request: Request[Any, Any, Any], policies: NamedDependency[PolicyStore], actor: NamedDependency[str]
) -> dict[str, Any]:
    """Replace the moderation policy (``default`` and ``tenants``, whole, plus a ``reason``).

    It is part of the one policy document: the flip is a new version of it, audited, sent to every replica
    as a thinking flip is; a ``version`` in the body is the one the change was made from (409 if stale).
    """
    body, reason, expected_version = await _policy_change(request)
    moderation = _validated(ModerationPolicy, body)
    update = await policies.amend(
        lambda current: current.model_copy(update={"moderation": moderation}), actor, reason, expected_version
    )
    if update.changed:
        log.warning("moderation policy in policy version %d by %s: %s", update.policy.version, actor, reason)
    return {**moderation_view(update.policy, policies), "changed": update.changed}


class RollbackRequest(BaseModel):
    """``POST /admin/thinking-policy/rollback``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    to_version: int | None = Field(default=None, ge=1)  # unset: the version before the one in force
    reason: str = Field(min_length=3, max_length=500, pattern=REASON_PATTERN)


@post(
    "/admin/thinking-policy/rollback", status_code=200, responses=error_responses(responses.ADMIN_ROLLBACK)
)
async def rollback_thinking_policy(
    data: JSONBody[RollbackRequest], policies: NamedDependency[PolicyStore], actor: NamedDependency[str]
) -> dict[str, Any]:
    """Put an earlier version's content back in force, as a new version (versions only go up)."""
    reason = _reason(data.reason)
    update = await policies.rollback(data.to_version, actor, reason)
    if update.changed:
        log.warning("thinking policy rolled back as version %d by %s: %s",
                    update.policy.version, actor, reason)
    return {**policy_view(update.policy, policies), "changed": update.changed}


@get("/admin/thinking-policy/history", responses=error_responses(responses.ADMIN_READ))
async def thinking_policy_history(
    policies: NamedDependency[PolicyStore], limit: Limit = 20
) -> dict[str, Any]:
    """Earlier policy documents, newest first."""
    documents = await policies.history(limit)
    return {"data": [{**json.loads(doc.model_dump_json()), "content_hash": doc.content_hash()}
                     for doc in documents]}


@get("/admin/audit", responses=error_responses(responses.ADMIN_READ))
async def audit_trail(policies: NamedDependency[PolicyStore], limit: Limit = 50) -> dict[str, Any]:
    """Who changed the policy, when, why, from which version to which, and what changed; newest first."""
    entries = await policies.audit(limit)
    return {"data": [json.loads(entry.model_dump_json()) for entry in entries]}


ROUTES = [
    thinking_policy_options, get_thinking_policy, put_thinking_policy, rollback_thinking_policy,
    thinking_policy_history, audit_trail,
    moderation_policy_options, get_moderation_policy, put_moderation_policy,
]
