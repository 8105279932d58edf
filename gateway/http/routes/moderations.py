"""``POST /v1/moderations`` (behind the business-key guard, gateway/http/guards.py)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.caller import Caller
from gateway.errors import InvalidRequest
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.providers import services_of
from gateway.http.quotas import TenantQuotas
from gateway.http.routes import responses
from gateway.http.routes.responses import error_responses
from gateway.moderation.service import ModerationService
from gateway.policy.rules import MODES, Mode
from gateway.settings import Settings
from gateway.wire import ImageURLPart, ModerationRequest, ModerationResponse

T = TypeVar("T")


async def within_quota(
    quotas: TenantQuotas, caller: Caller, keyframes: int, work: Callable[[], Awaitable[T]]
) -> Response[T]:
    """Run ``work`` if the tenant is within its quotas (429 otherwise), with the ``x-ratelimit-*`` headers."""
    with quotas.concurrent(caller.tenant):
        headers = await quotas.take_keyframes(caller.tenant, keyframes)
        return Response(await work(), headers=headers)


_JSON_ESCAPES = re.compile(rb'\\\\|\\"')  # an escaped backslash or quote: neither opens nor closes anything
_JSON_STRINGS = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_CHUNK = 1 << 20


def json_depth(body: bytes, stop_after: int) -> int:
    """How deep a JSON text nests arrays and objects (brackets inside strings ignored).

    Counted at C speed, as the body may be megabytes of base64 or of brackets: everything but quotes and
    brackets is dropped, then strings, then the nesting is a running sum, in chunks, stopping past
    ``stop_after``.
    """
    if b"\\" in body:  # a base64 body has no backslash: skip a regular-expression pass over megabytes
        body = _JSON_ESCAPES.sub(b"", body)
    structure = _JSON_STRINGS.sub(b"", body.translate(None, _NOT_STRUCTURE))
    depth = deepest = 0
    for start in range(0, len(structure), _CHUNK):
        chunk = np.frombuffer(structure, np.uint8, count=min(_CHUNK, len(structure) - start), offset=start)
        levels = np.cumsum(np.where((chunk == ord("[")) | (chunk == ord("{")), 1, -1)) + depth
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        if deepest > stop_after:
            break
    return deepest


def openers_at_most(body: bytes, limit: int) -> bool:
    """Whether ``body`` holds at most ``limit`` opening brackets (``[`` and ``{``, in strings or not): then it
    cannot nest deeper than ``limit``. Found by ``bytes.find`` (memchr), at most ``limit + 1`` of each, so a
    keyframe's body (a handful of brackets around ~160 KiB of base64) is passed in a few scans at C speed,
    where ``json_depth``'s translation of every byte took ten times as long."""
    found = 0
    for opener in b"[{":
        start = 0
        while (start := body.find(opener, start) + 1) > 0:
            found += 1
            if found > limit:
                return False
    return True


async def refuse_deep_json(request: Request[Any, Any, Any]) -> None:
    """Before the body is parsed: refuse JSON nested past the limit (the parser would fail with a 500)."""
    limit = services_of(request.app).settings.limits.max_json_depth
    body = await request.body()
    if not openers_at_most(body, limit) and json_depth(body, stop_after=limit) > limit:
        raise InvalidRequest(f"the JSON body nests deeper than {limit} levels", code="json_too_deep")


def requested_mode(value: str | None) -> Mode | None:
    """``X-Modgate-Thinking: on|off|escalate``."""
    if value is None:
        return None
    for mode in MODES:
        if value == mode:
            return mode
    raise InvalidRequest(
        "X-Modgate-Thinking must be 'on', 'off' or 'escalate'", param="X-Modgate-Thinking"
    )


@post(
    "/v1/moderations", status_code=200, before_request=refuse_deep_json,
    responses=error_responses(responses.MODERATION),
)
async def create_moderation(
    request: Request[Any, Any, Any],
    data: JSONBody[ModerationRequest],
    settings: NamedDependency[Settings],
    quotas: NamedDependency[TenantQuotas],
    moderation: NamedDependency[ModerationService],
    caller: NamedDependency[Caller],
) -> Response[ModerationResponse]:
    """Moderate keyframes: the OpenAI moderation request and response, one result per image."""
    requested = requested_mode(request.headers.get("x-modgate-thinking"))
    max_images = settings.shaping.max_images_per_request
    if isinstance(data.input, list) and not data.input:
        raise InvalidRequest("input is empty: send at least one image or text", param="input")
    if isinstance(data.input, list) and len(data.input) > max_images:
        raise InvalidRequest(f"at most {max_images} inputs per request, got {len(data.input)}", param="input")
    # Cache-Control: no-cache asks for a fresh engine verdict (the quality module's re-runs need one).
    fresh = "no-cache" in request.headers.get("cache-control", "").lower()
    images = sum(isinstance(part, ImageURLPart) for part in data.input) if isinstance(data.input, list) else 0
    return await within_quota(  # a keyframe counts against the quota; a text-only request counts as one
        quotas, caller, max(1, images),
        lambda: cancel_on_disconnect(
            request, moderation.moderate(data, caller, requested, fresh=fresh)
        ),
    )


ROUTES = [create_moderation]
