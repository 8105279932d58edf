"""The gateway's exception tree, rendered in the OpenAI error shape by one handler.

ModgateError
├── ClientError (4xx: the caller can fix it)
│   ├── InvalidRequest 400, Unauthorized 401, Forbidden 403, NotFound 404, Conflict 409
│   ├── PayloadTooLarge 413, UnsupportedMedia 415, UnprocessableImage 422, UnprocessableRequest 422
│   └── Overloaded 429 (with Retry-After)
└── ServerSideError (5xx: the caller should retry later)
    ├── UpstreamError 502 (the engine answered badly: 5xx, malformed body, stream cut)
    ├── EngineUnavailable 503 (cannot connect, circuit open, not ready)
    ├── UpstreamTimeout 504 (connect, first token or total deadline passed)
    └── StateUnavailable 503 (Redis unreachable for an operation that needs it)
"""

from __future__ import annotations

from typing import Any, ClassVar


class ModgateError(Exception):
    """Base of every error the gateway answers with."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param

    def headers(self) -> dict[str, str]:
        """Extra response headers."""
        return {}

    def body(self) -> dict[str, Any]:
        """The OpenAI error shape."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ClientError(ModgateError):
    """The request cannot be served as sent."""

    status = 400
    type = "invalid_request_error"
    default_code = "invalid_request"


class InvalidRequest(ClientError):
    """Malformed or out-of-bounds request."""


class Unauthorized(ClientError):
    """No or unknown credentials."""

    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class Forbidden(ClientError):
    """Known credentials without the right to this call."""

    status = 403
    type = "permission_error"
    default_code = "forbidden"


class NotFound(ClientError):
    """No such resource."""

    status = 404
    default_code = "not_found"


class Conflict(ClientError):
    """The request conflicts with the current state (e.g. a stale policy version)."""

    status = 409
    default_code = "conflict"


class PayloadTooLarge(ClientError):
    """Body, image bytes or pixels over a limit."""

    status = 413
    default_code = "payload_too_large"


class UnsupportedMedia(ClientError):
    """An image format outside the allowlist."""

    status = 415
    default_code = "unsupported_media_type"


class UnprocessableImage(ClientError):
    """An image that cannot be decoded or is not a still frame."""

    status = 422
    default_code = "unprocessable_image"


class UnprocessableRequest(ClientError):
    """A body the OpenAPI document accepts that breaks a rule no schema can state (a low mark above its
    high mark, two rules of one name): RFC 9110's 422, not the 400 of a body outside the document."""

    status = 422
    default_code = "unprocessable_request"


class Overloaded(ClientError):
    """Admission queue full or its deadline passed: try again after ``retry_after`` seconds."""

    status = 429
    type = "rate_limit_error"
    default_code = "overloaded"

    def __init__(self, message: str, *, retry_after: int, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """Tell the caller when to come back."""
        return {"Retry-After": str(self.retry_after)}


class EnginesBusy(Overloaded):
    """Every engine answered busy until the queue's deadline: a 429 like a full queue, counted (and alerted
    on) under its own outcome, ``engine_busy``: the engines, not the gateway's queue, are out of room."""

    default_code = "engine_busy"


class ServerSideError(ModgateError):
    """Something behind the gateway failed."""


class UpstreamError(ServerSideError):
    """The engine answered, but not usably."""

    status = 502
    default_code = "engine_bad_response"


class EngineUnavailable(ServerSideError):
    """The engine cannot be reached (or is held off by its circuit breaker)."""

    status = 503
    default_code = "engine_unavailable"


class EngineBusy(EngineUnavailable):
    """The engine said it is busy (its own queue full, no slot free): back-pressure, not a failure.

    Never counted against the engine's circuit; the call waits in the gateway or moves to another engine
    (gateway/engine/pool.py). A caller sees it only as the 429 ``engine_busy`` once the queue's deadline
    passed."""

    default_code = "engine_busy"


class UpstreamTimeout(ServerSideError):
    """A deadline passed while waiting on the engine."""

    status = 504
    default_code = "engine_timeout"


class StateUnavailable(ServerSideError):
    """The shared state store (Redis) cannot be reached for an operation that needs it."""

    status = 503
    default_code = "state_unavailable"
