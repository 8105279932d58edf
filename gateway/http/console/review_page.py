"""The reviewer's page, ``/console/review``: one queued frame at a time, one key per decision.

A signed-in console user claims the next item of the tenants they may review (``n``), sees its frame, the
model's verdict, categories, confidence and reasoning (when thinking was on) and why it is queued, and
decides by keys: ``a`` allow, ``s`` skip (the item goes back to the end of its tenant's queue), or
``1``..``8`` to toggle the categories a block names (a block verdict's are ticked to start with) and ``b`` to
block with them. Each decision is a form post carrying the session's CSRF token; the page answers with a
redirect to the next item (post/redirect/get: a reload never decides twice).
The frame is served by its own route, which checks the session and the item's tenant and is never cached.
The queue's depth and oldest age per tenant sit beside the item. Everything goes through the review queue's
own calls (:class:`gateway.review.service.ReviewQueue`), as ``/admin/review/*`` does.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from gateway.errors import Forbidden, ModgateError, NotFound, Unauthorized
from gateway.http.console.access import require
from gateway.http.console.oidc import OidcSignIn
from gateway.http.console.routes import (
    _PAGE_HEADERS,
    _csrf,
    _csrf_refused,
    _field,
    _html,
    _Operator,
    _render,
    _see_other,
    _sign_in_page,
)
from gateway.http.routes.review import ITEM_ID_PATTERN
from gateway.review.models import ConflictKind, QueuedItem, ReviewConflict
from gateway.review.service import Reviewer, ReviewQueue
from gateway.settings import Settings
from shaping.image.data_url import decode_data_url
from shaping.verdict import MODEL_CATEGORIES, Action

log = logging.getLogger("modgate.console")

PAGE: Final = "/console/review"
_ITEM_ID = re.compile(ITEM_ID_PATTERN)


def _item_id(text: str) -> str:
    """A review item's id as the queue makes them; anything else is no item (404)."""
    if not _ITEM_ID.match(text):
        raise NotFound(f"no review item {text[:40]!r}", code="review_item_gone")
    return text


def console_reviewer(person: _Operator) -> Reviewer:
    """The reviewer a console user is, named as the console names them in every audit trail: an operator (the
    admin token, or signed in as one) reviews every tenant; a reviewer signed in through OpenID Connect, the
    tenants their session names. Every role may review (gateway/http/console/access.py says so)."""
    require(person.role, "review")
    return Reviewer(name=person.actor, tenants=None if person.session is None else person.session.tenants)


@dataclass(frozen=True, slots=True)
class Decision:
    """One thing a reviewer may do with an item, and its key."""

    value: str  # the form's value
    key: str
    title: str
    action: Action | None  # None: skip
    categories: tuple[str, ...] = ()


DECISIONS: Final = {
    decision.value: decision
    for decision in (
        Decision("allow", "a", "Allow", "allow"),
        Decision("block", "b", "Block with the categories ticked", "block"),
        *(Decision(f"block:{category}", "", f"Block: {category}", "block", (category,))
          for category in MODEL_CATEGORIES),
        Decision("skip", "s", "Skip", None),
    )
}
"""Every decision by its form value: allow, block (with the ticked ``category`` fields), block with one
category (``block:<category>``, a form without the page's script), skip."""

CATEGORY_KEYS: Final = {str(n): category for n, category in enumerate(MODEL_CATEGORIES, start=1)}
"""The key that toggles each category a block names."""


def _chosen(decision: Decision, form: Any) -> Decision | None:
    """The decision with the categories ticked on the form (a ``block``); None: a block naming none or one
    the model does not know."""
    if decision.value != "block":
        return decision
    ticked = [value for value in form.getall("category", []) if isinstance(value, str)]
    if not ticked or any(name not in MODEL_CATEGORIES for name in ticked):
        return None
    categories = tuple(sorted(set(ticked)))
    return Decision(decision.value, decision.key, f"Block: {', '.join(categories)}", "block", categories)

_REASONS: Final = {
    "review": "the model said review",
    "unsure": "the model's confidence is under the review threshold",
    "audit": "an audit sample of a confident verdict",
}
_CONFLICTS: Final[dict[ConflictKind, str]] = {
    "labelled": "Someone else labelled this item meanwhile: your decision was not recorded.",
    "gone": "This item left the queue (its retention passed): your decision was not recorded.",
    "claimed": "Another reviewer holds this item now (your claim timed out and they took it over): your "
               "decision was not recorded.",
    "unclaimed": "You no longer hold this item (your claim timed out): your decision was not recorded.",
}


async def _page(
    review: ReviewQueue, settings: Settings, operator: _Operator, *, item: QueuedItem | None = None,
    status: int = 200, notice: str | None = None, error: str | None = None,
) -> Response[str]:
    """The page: the item (if any), its decisions, and the queue per tenant the reviewer may see."""
    queues, queue_error = {}, None
    try:
        queues = await review.queues(console_reviewer(operator))
    except ModgateError as exc:  # Redis down: the page still says what it can
        queue_error = exc.message
    return _html(_render(
        "review.html", operator=operator, csrf=_csrf(settings, operator), item=item.item if item else None,
        decisions=[d for d in DECISIONS.values() if d.key], categories=CATEGORY_KEYS, reasons=_REASONS,
        queues=queues, queue_error=queue_error,
        notice=notice, error=error, page="review", now=time.time(),
    ), status=status)


def _next(item_id: str | None, **query: str) -> Response[str]:
    """To the page, showing the item now held (or saying nothing waits)."""
    params = {**query, **({"item": item_id} if item_id else {"empty": "1"})}
    return _see_other(f"{PAGE}?{urlencode(params)}")


def _done_notice(done: str | None) -> str | None:
    if done and done.startswith("block:") and all(c in MODEL_CATEGORIES for c in done[6:].split(",")):
        return f"Recorded: block: {done[6:].replace(',', ', ')}."
    decision = DECISIONS.get(done or "")
    if decision is None:
        return None
    if decision.action is None:
        return "Skipped: the item went back to the end of its tenant's queue."
    return f"Recorded: {decision.title.lower()}."


@get(PAGE, include_in_schema=False)
async def review_page(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings],
    oidc: NamedDependency[OidcSignIn | None], review: NamedDependency[ReviewQueue],
    visitor: NamedDependency[_Operator | None],
) -> Response[str]:
    """The page, with the item the user holds (``?item=``), or a prompt to claim the next."""
    if settings.auth.admin_token is None:
        return _sign_in_page(settings, oidc, status=403)
    if visitor is None:
        return _sign_in_page(settings, oidc)
    notice = _done_notice(request.query_params.get("done"))
    item_id = request.query_params.get("item")
    if item_id is None:
        if request.query_params.get("empty") is not None:
            notice = " ".join(filter(None, (notice, "Nothing waits for you now.")))
        return await _page(review, settings, visitor, notice=notice)
    reviewer = console_reviewer(visitor)
    try:
        found = await review.look(_item_id(item_id), reviewer)
    except (NotFound, Forbidden) as exc:
        return await _page(review, settings, visitor, status=exc.status, error=exc.message)
    if found.holder != reviewer.name:
        return await _page(review, settings, visitor, status=409, error=(
            f"You do not hold review item {item_id} now (your claim timed out, or it was given back): "
            "claim the next item."
        ))
    return await _page(review, settings, visitor, item=found, notice=notice)


@post(f"{PAGE}/next", include_in_schema=False)
async def review_claim_next(
    request: Request[Any, Any, Any], settings: NamedDependency[Settings],
    oidc: NamedDependency[OidcSignIn | None], review: NamedDependency[ReviewQueue],
    person: NamedDependency[_Operator | None],
) -> Response[str]:
    """Claim the next item for the user."""
    operator = person
    if operator is None:
        return _sign_in_page(settings, oidc, 401, "Sign in to review.")
    if _csrf_refused(settings, operator, await request.form()):
        return await _page(review, settings, operator, status=403, error=(
            "Refused: this form did not come from this console session. Nothing was claimed; reload the page."
        ))
    try:
        item = await review.claim(console_reviewer(operator))
    except ModgateError as exc:
        return await _page(review, settings, operator, status=exc.status,
                           error=f"Nothing claimed: {exc.message}")
    return _next(item.id if item else None)


@post(f"{PAGE}/{{item_id:str}}/decide", include_in_schema=False)
async def review_decide(
    item_id: FromPath[str], request: Request[Any, Any, Any], settings: NamedDependency[Settings],
    oidc: NamedDependency[OidcSignIn | None], review: NamedDependency[ReviewQueue],
    person: NamedDependency[_Operator | None],
) -> Response[str]:
    """Label the item the user holds (or skip it), then claim the next."""
    operator = person
    if operator is None:
        return _sign_in_page(settings, oidc, 401, "Sign in to review.")
    form = await request.form()
    if _csrf_refused(settings, operator, form):
        log.warning("console: refused a review decision without a valid CSRF token (%s)", operator.actor)
        return await _page(review, settings, operator, status=403, error=(
            "Refused: this form did not come from this console session. Nothing recorded; reload the page."
        ))
    decision = DECISIONS.get(_field(form, "decision"))
    if decision is not None:
        decision = _chosen(decision, form)
    if decision is None:
        return await _page(review, settings, operator, status=400, error=(
            "Choose a decision: allow, block (with at least one category ticked) or skip."
        ))
    reviewer = console_reviewer(operator)
    try:
        if decision.action is None:
            await review.skip(item_id, reviewer)
        else:
            done = await review.label(item_id, reviewer, decision.action, decision.categories)
            log.info("review item %s labelled %s by %s (model: %s)", item_id, decision.value, reviewer.name,
                     done.item.action)
        item = await review.claim(reviewer)
    except ReviewConflict as exc:
        return await _page(review, settings, operator, status=409,
                           error=f"{_CONFLICTS[exc.kind]} ({exc.message})")
    except ModgateError as exc:  # Redis down
        return await _page(review, settings, operator, status=exc.status,
                           error=f"Not recorded: {exc.message}")
    done_value = f"block:{','.join(decision.categories)}" if decision.action == "block" else decision.value
    return _next(item.id if item else None, done=done_value)


@get(f"{PAGE}/{{item_id:str}}/frame", include_in_schema=False)
async def review_frame(
    item_id: FromPath[str], review: NamedDependency[ReviewQueue], person: NamedDependency[_Operator | None]
) -> Response[bytes]:
    """The item's shaped frame, for a signed-in user who may review its tenant; never cached."""
    if person is None:
        raise Unauthorized("sign in to the console to see a review item's frame")
    found = await review.look(_item_id(item_id), console_reviewer(person))
    mime, frame = decode_data_url(found.item.frame, len(found.item.frame))
    return Response(frame, media_type=mime, headers=_PAGE_HEADERS)


ROUTES = [review_page, review_claim_next, review_decide, review_frame]
