"""The error statuses each route answers, for its OpenAPI description: every one in the OpenAI error shape.

A route lists what it can really answer (``tests/gateway/test_openapi_document.py`` provokes each status
of ``POST /v1/moderations`` and checks it is documented, and schemathesis checks every status it sees).
"""

from __future__ import annotations

from litestar.openapi.datastructures import ResponseSpec

from gateway.wire import OpenAIErrorResponse

_MEANING: dict[int, str] = {
    400: "Malformed request: a body that does not match the schema, bad base64, a bad header or parameter",
    401: "No API key, or one the gateway does not know (authentication_error)",
    403: "Known credentials without the right to this call: a business API key on an admin route; a remote "
         "image or video URL the operator does not allow (its host off the allowlist, or not public)",
    404: "No such resource (another tenant's job reads as not found)",
    409: "Conflicts with the current state: an Idempotency-Key reused for another request, a stale version",
    413: "Too large: the body, an image's bytes, or the pixels its header claims",
    415: "An image format outside the allowlist (JPEG, PNG, WebP)",
    422: "An image that cannot be used (undecodable, animated, or longer than 200:1), or a policy that "
         "breaks a rule between its fields (a low mark above its high mark, two rules of one name)",
    429: "Overloaded (the admission queue is full or its deadline passed) or over the tenant's quota; see "
         "Retry-After and x-ratelimit-* (rate_limit_error)",
    500: "A gateway bug: logged with its traceback, answered without details",
    502: "The engine answered, but not usably (5xx, malformed body, stream cut)",
    503: "The engine cannot be reached (or its circuit breaker holds calls off), or Redis for a call that "
         "needs it",
    504: "A deadline passed while waiting on the engine (connect, first token or total)",
}

# What the moderation path can answer, on top of its success status.
MODERATION = (400, 401, 403, 413, 415, 422, 429, 500, 502, 503, 504)  # 403: a remote URL not allowed
JOB_SUBMIT = (400, 401, 403, 409, 413, 415, 422, 429, 500, 503)
JOB_READ = (400, 401, 404, 500, 503)
ADMIN_READ = (400, 401, 403, 500, 503)
ADMIN_CHANGE = (400, 401, 403, 409, 413, 422, 500, 503)
ADMIN_ROLLBACK = (*ADMIN_CHANGE, 404)  # no such version


def error_responses(statuses: tuple[int, ...]) -> dict[int, ResponseSpec]:
    """``responses=`` for a route handler: each status with its meaning and the OpenAI error schema."""
    return {
        status: ResponseSpec(data_container=OpenAIErrorResponse, description=_MEANING[status])
        for status in statuses
    }
