"""One place that renders every error in the OpenAI error shape."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap

from gateway.errors import InvalidRequest, ModgateError

log = logging.getLogger("modgate.gateway")


def modgate_error(_: Request[Any, Any, Any], exc: ModgateError) -> Response[dict[str, Any]]:
    """A gateway error: its status, headers and body."""
    if exc.status >= 500:
        log.warning("request failed: %s (%s)", exc.message, exc.code)
    return Response(exc.body(), status_code=exc.status, headers=exc.headers())


def validation_error(request: Request[Any, Any, Any], exc: ValidationException) -> Response[dict[str, Any]]:
    """A body that does not match its wire model: 400, naming the first bad field."""
    details = exc.extra if isinstance(exc.extra, list) else []
    first = details[0] if details and isinstance(details[0], dict) else {}
    where = first.get("key") or None
    message = f"{where}: {first.get('message')}" if first else str(exc.detail)
    return modgate_error(request, InvalidRequest(f"invalid request body: {message}", param=where))


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
    """Litestar's own HTTP errors (unknown route, wrong method, body too large)."""
    response = modgate_error(request, InvalidRequest(str(exc.detail), code=_HTTP_CODES.get(exc.status_code)))
    response.status_code = exc.status_code
    # a 405's Allow (RFC 9110 §15.5.6): Litestar's router names the route's methods in the exception
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


def unexpected_error(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Our own bug: logged with its traceback, answered 500 without details."""
    log.exception("unexpected error on %s", request.url.path, exc_info=exc)
    return Response(
        {
            "error": {
                "message": "internal error",
                "type": "server_error",
                "param": None,
                "code": "internal_error",
            }
        },
        status_code=500,
    )


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ModgateError: modgate_error,
    ValidationException: validation_error,
    HTTPException: http_error,
    Exception: unexpected_error,
}
