"""The review queue's calls, ``/admin/review/*``: claim the next item, label it (or skip it), see the queue.

Who may call them: the admin token (automation: every tenant), or the console's session cookie of an
operator (every tenant) or a reviewer (their tenants only; a change also needs the session's CSRF token in
``X-Modgate-CSRF``), checked by the router's guard (:func:`review_access`); a reviewer reaches these and
nothing else under ``/admin`` (gateway/http/console/access.py). A label is refused with 409 when the item
is already labelled, has expired, or is held by someone else (or by no one: claim it first).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Final, Literal

from litestar import Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody, Parameter
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import UnprocessableRequest
from gateway.http.auth import operator_name
from gateway.http.console.access import console_session, csrf_checked, require
from gateway.http.providers import services_of
from gateway.http.routes.responses import error_responses
from gateway.review.models import LabelledItem, ReviewItem
from gateway.review.service import Reviewer, ReviewQueue
from shaping.verdict import MODEL_CATEGORIES, Action

log = logging.getLogger("modgate.review")

_REVIEWER: Final = "modgate.reviewer"
ITEM_ID_PATTERN: Final = r"^rev-[0-9a-f]{32}$"
REVIEW_READ: Final = (400, 401, 403, 500, 503)
REVIEW_LABEL: Final = (400, 401, 403, 409, 422, 500, 503)

Category = Literal[MODEL_CATEGORIES]  # type: ignore[valid-type]  # the tuple is the vocabulary


async def review_access(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """The admin token (a reviewer of every tenant, named as the audit trail names admin calls), else the
    console's session: its person, with their tenants (an operator's: every tenant)."""
    services = services_of(connection.app)
    authorization = connection.headers.get("authorization")
    if authorization is None:
        session = await console_session(connection, services.settings, services.console)
        if session is not None:
            require(session.role, "review")
            csrf_checked(connection, services.settings, session)
            connection.state[_REVIEWER] = Reviewer(name=session.reviewer_name, tenants=session.tenants)
            return
    token_id = await services.keys.authorize_admin(authorization)
    operator = operator_name(connection.headers.get("x-modgate-operator"))
    name = token_id if operator is None else f"{operator} ({token_id})"
    connection.state[_REVIEWER] = Reviewer(name=name, tenants=None)


def _reviewer(request: Request[Any, Any, Any]) -> Reviewer:
    reviewer: Reviewer = request.state[_REVIEWER]
    return reviewer


REVIEWER: Final = {"reviewer": Provide(_reviewer, sync_to_thread=False)}
"""The ``reviewer`` dependency of routes behind :func:`review_access`."""


class ReviewLabelRequest(BaseModel):
    """``POST /admin/review/{id}/label``: the human decision."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: Action
    categories: list[Category] = Field(default_factory=list, max_length=len(MODEL_CATEGORIES))


def item_view(item: ReviewItem) -> dict[str, Any]:
    """The item as a reviewer sees it (the wire's names first, then the project's)."""
    return {
        "id": item.id,
        "tenant": item.tenant,
        "frame": item.frame,
        "action": item.action,
        "categories": list(item.categories),
        "confidence": item.confidence,
        # project fields
        "reason": item.reason,
        "thinking": item.thinking,
        "reasoning": item.reasoning,
        "request_id": item.request_id,
        "decision_id": item.decision_id,
        "enqueued_at": item.enqueued_at,
    }


def labelled_view(done: LabelledItem) -> dict[str, Any]:
    """A label's answer: the human decision beside the model's."""
    item, label = done.item, done.label
    return {
        "id": item.id,
        "tenant": item.tenant,
        "decision_id": item.decision_id,
        "label": {"action": label.action, "categories": list(label.categories), "reviewer": label.reviewer,
                  "labelled_at": label.labelled_at},
        "model": {"action": item.action, "categories": list(item.categories), "confidence": item.confidence},
        "agrees": done.agrees,
    }


@post("/admin/review/claim", status_code=200, responses={
    **error_responses(REVIEW_READ), 204: ResponseSpec(data_container=None, description="No item waits"),
})
async def claim_review_item(
    review: NamedDependency[ReviewQueue], reviewer: NamedDependency[Reviewer]
) -> Response[dict[str, Any] | None]:
    """The next item, now held by the caller until labelled, skipped, or the claim timeout; 204 if none."""
    item = await review.claim(reviewer)
    if item is None:
        return Response(None, status_code=204)
    return Response(item_view(item), status_code=200)


@post(
    "/admin/review/{item_id:str}/label", status_code=200, responses=error_responses(REVIEW_LABEL)
)
async def label_review_item(
    item_id: FromPath[str],
    data: JSONBody[ReviewLabelRequest],
    review: NamedDependency[ReviewQueue],
    reviewer: NamedDependency[Reviewer],
) -> dict[str, Any]:
    """Label an item the caller holds; the frame is deleted with the item."""
    if (data.action == "block") != bool(data.categories):  # a rule between fields: 422, not 400
        raise UnprocessableRequest(
            "a block names at least one category; allow and review name none", param="categories"
        )
    done = await review.label(item_id, reviewer, data.action, data.categories)
    log.info("review item %s labelled %s by %s (model: %s)", item_id, data.action, reviewer.name,
             done.item.action)
    return labelled_view(done)


@post(
    "/admin/review/{item_id:str}/skip", status_code=204, responses=error_responses(REVIEW_LABEL)
)
async def skip_review_item(
    item_id: FromPath[str], review: NamedDependency[ReviewQueue], reviewer: NamedDependency[Reviewer]
) -> None:
    """Give an item the caller holds back to the queue, for someone else."""
    await review.skip(item_id, reviewer)


@get("/admin/review/queue", responses=error_responses(REVIEW_READ))
async def review_queue(
    review: NamedDependency[ReviewQueue], reviewer: NamedDependency[Reviewer]
) -> dict[str, Any]:
    """Depth (waiting or claimed), claimed count and the oldest item's age, per tenant the caller may see."""
    figures = await review.queues(reviewer)
    return {"tenants": {
        tenant: {"depth": q.depth, "claimed": q.claimed, "oldest_age_s": q.oldest_age_s}
        for tenant, q in figures.items()
    }}


@get("/admin/review/audit", responses=error_responses(REVIEW_READ))
async def review_audit(
    review: NamedDependency[ReviewQueue], reviewer: NamedDependency[Reviewer],
    limit: Annotated[int, Parameter(ge=1, le=1000)] = 50,
) -> dict[str, Any]:
    """Every label with its reviewer, the item and the model's verdict beside it; newest first."""
    return {"data": await review.audit(limit, reviewer)}


ROUTES = [claim_review_item, label_review_item, skip_review_item, review_queue, review_audit]
