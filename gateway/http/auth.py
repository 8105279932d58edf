"""Who is calling: business API keys (one tenant each) and the separate admin token.

Keys are kept only as SHA-256 digests and compared in constant time; a key is never logged. Keys may also
live in Redis (``modgate keys add``, digests only, see gateway/http/keys_store.py): with
``MODGATE_AUTH__API_KEYS_FROM_REDIS`` on, a key not in the settings is looked up there by its digest. The
routes ask through guards, once per request (gateway/http/guards.py).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Protocol

from gateway.caller import Caller
from gateway.errors import Forbidden, InvalidRequest, StateUnavailable, Unauthorized

OPERATOR_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
"""The names the audit trail accepts for the person behind the shared admin token (as X-Modgate-Operator)."""


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def operator_name(header: str | None) -> str | None:
    """The name an ``X-Modgate-Operator`` header gives (None when it is not sent); 400 when it is no name."""
    if header is not None and not OPERATOR_NAME.match(header):
        raise InvalidRequest(
            "X-Modgate-Operator must be 1-64 of A-Z a-z 0-9 _ . @ -", param="X-Modgate-Operator"
        )
    return header


class KeyLookup(Protocol):
    """Where further keys live, looked up by their SHA-256 hex digest (the Redis key store)."""

    async def tenant_for_digest(self, digest_hex: str) -> str | None: ...


class KeyRing:
    """Business keys (digests only) and the admin token (digest only)."""

    def __init__(
        self, tenant_keys: dict[str, str], admin_token: str | None, *, keys_in_store: bool = False
    ) -> None:
        self._keys = [(_digest(key), tenant) for key, tenant in tenant_keys.items()]
        self._admin = _digest(admin_token) if admin_token else None
        self._keys_in_store = keys_in_store
        self.store: KeyLookup | None = None  # attached when the app's Redis client opens

    @property
    def open(self) -> bool:
        """No key configured: business calls need none (the quick-start default)."""
        return not self._keys and not self._keys_in_store

    async def authenticate(self, authorization: str | None) -> Caller:
        """The tenant behind a business call: the settings' keys first, then the key store; or 401."""
        try:
            return self.caller(authorization)
        except Unauthorized:
            token = bearer_token(authorization)
            if self.store is None or token is None:
                raise
            digest = _digest(token)
            tenant = await self.store.tenant_for_digest(digest.hex())
            if tenant is None:
                raise
            return Caller(tenant=tenant, key_id=digest.hex()[:8])

    def caller(self, authorization: str | None) -> Caller:
        """The tenant behind a business call, or 401."""
        token = bearer_token(authorization)
        if self.open:
            return Caller(tenant="default", key_id="none")
        if token is None:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        digest = _digest(token)
        tenant = None
        for known, owner in self._keys:  # every key compared: the time does not say which one matched
            if hmac.compare_digest(known, digest):
                tenant = owner
        if tenant is None:
            raise Unauthorized("invalid API key")
        return Caller(tenant=tenant, key_id=digest.hex()[:8])

    async def authorize_admin(self, authorization: str | None) -> str:
        """Check an admin call (as :meth:`admin`), and answer 403, not 401, to a business key held in the key
        store too: the caller is known, just not allowed. A store that cannot be asked leaves it a 401."""
        try:
            return self.admin(authorization)
        except Unauthorized:
            token = bearer_token(authorization)
            if self.store is None or token is None:
                raise
            try:
                tenant = await self.store.tenant_for_digest(_digest(token).hex())
            except StateUnavailable:
                raise Unauthorized("invalid admin token") from None
            if tenant is not None:
                raise Forbidden("a business API key cannot make admin calls") from None
            raise

    def admin(self, authorization: str | None) -> str:
        """Check an admin call against the admin token and the settings' keys; answers an actor name safe to
        log (routes use :meth:`authorize_admin`, which also knows the key store's business keys)."""
        if self._admin is None:
            raise Forbidden("admin calls are disabled: set MODGATE_AUTH__ADMIN_TOKEN", code="admin_disabled")
        token = bearer_token(authorization)
        if token is None:
            raise Unauthorized(
                "missing admin token: send 'Authorization: Bearer <MODGATE_AUTH__ADMIN_TOKEN>'"
            )
        digest = _digest(token)
        if not hmac.compare_digest(self._admin, digest):
            if any(hmac.compare_digest(known, digest) for known, _ in self._keys):
                raise Forbidden("a business API key cannot make admin calls")
            raise Unauthorized("invalid admin token")
        return f"admin:{digest.hex()[:8]}"
