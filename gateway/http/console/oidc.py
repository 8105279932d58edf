"""Console sign-in with OpenID Connect: the authorization-code flow with PKCE and a nonce, the ID token
checked against the issuer's keys, and the person's role and tenants read from their claims.

One sign-in:

1. :meth:`OidcSignIn.begin`: a fresh state, nonce and PKCE verifier; the browser goes to the provider's
   authorization endpoint (found in ``<issuer>/.well-known/openid-configuration``), and the three values
   ride in a signed cookie that lives ten minutes (``SessionSigner.seal_flow``), so any replica can finish.
2. :meth:`OidcSignIn.finish`: the provider sends the browser back with a code and the state; the code is
   exchanged at the token endpoint with the verifier (and the client secret, for a confidential client).
   The ID token's signature is checked against the issuer's JWKS (fetched again once for an unknown key
   id: the provider rotated its keys), then its iss, aud and azp, exp and iat, and the nonce. Claims it
   lacks (the roles, the tenants) are read from the userinfo endpoint with the access token, whose subject
   must be the ID token's.
3. :meth:`OidcSignIn.person`: the operator role wins over the reviewer role; with neither, the sign-in is
   refused. A reviewer's tenants come from the tenants claim (none: the queue shows them nothing).

Authlib prepares what the flow sends (the authorization URI, the S256 challenge, the token request and
its client authentication) and holds the ID token to OpenID Connect's claim rules (``CodeIDToken``, over
joserfc, its JOSE library). Its own httpx client is not used: it deprecates plain httpx for the httpx2
package, so the calls go through the gateway's httpx client.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri, prepare_token_request
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

from gateway.console_settings import OidcSettings
from gateway.http.auth import OPERATOR_NAME
from gateway.http.console.sessions import Role

log = logging.getLogger("modgate.console")

CALLBACK_PATH = "/console/oidc/callback"
LEEWAY_S = 60  # clock difference tolerated between the provider and this gateway
_SUBJECT = re.compile(r"^[A-Za-z0-9_.@:|+-]{1,128}$")  # a subject the audit trail can show as it is
_SIGNING_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class SignInFailed(Exception):
    """A sign-in the console refuses: ``message`` is for the person, ``status`` is the page's HTTP status
    (401 the proof did not hold, 403 no modgate role, 502 the provider failed)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class ProviderMetadata:
    """What the console needs of the provider's discovery document."""

    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    signing_algs: tuple[str, ...]  # the asymmetric ones it signs ID tokens with ("none" and HMAC never)


@dataclass(frozen=True, slots=True)
class SignInStart:
    """Where to send the browser, and the values the flow cookie keeps until it comes back."""

    url: str
    flow: dict[str, str]  # state, nonce, verifier


@dataclass(frozen=True, slots=True)
class Person:
    """Who signed in: their name for the audit trail, the provider's subject, their role and tenants."""

    name: str  # the verified e-mail address (or user name) when it fits the audit trail's names, else "user"
    token_id: str  # "oidc:<subject>" (a digest of a subject the audit trail cannot show as it is)
    role: Role
    tenants: frozenset[str] | None  # a reviewer's; None for an operator (every tenant)


def claim_at(claims: Mapping[str, Any], path: str) -> Any:
    """A claim by name, or by a dotted path into nested objects (``realm_access.roles``); None if absent."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _names(value: Any) -> list[str]:
    """A claim holding names: a list of strings, or one string of names split by spaces or commas."""
    if isinstance(value, str):
        return [name for name in re.split(r"[\s,]+", value) if name]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str) and item]
    return []


class OidcSignIn:
    """The console's relying party: discovery, the code flow, and the person behind an ID token."""

    def __init__(
        self, settings: OidcSettings, http: httpx.AsyncClient, clock: Callable[[], float] = time.time
    ) -> None:
        # all three are required with the issuer (OidcSettings checks it)
        assert settings.issuer is not None
        assert settings.client_id is not None
        assert settings.redirect_base_url is not None
        self.settings = settings
        self.issuer = settings.issuer
        self.client_id = settings.client_id
        self.redirect_uri = settings.redirect_base_url + CALLBACK_PATH
        self._http = http
        self._clock = clock
        self._metadata: ProviderMetadata | None = None
        self._keys: KeySet | None = None
        self._lock = asyncio.Lock()

    @property
    def provider_name(self) -> str:
        """The sign-in button's provider."""
        return self.settings.provider_name

    async def _get_json(self, url: str, what: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await self._http.get(url, timeout=self.settings.timeout_s, **kwargs)
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.error("console: OpenID Connect %s at %s failed: %s", what, url, exc)
            raise SignInFailed(f"The sign-in provider did not answer ({what}): try again.", 502) from exc
        if not isinstance(document, dict):
            raise SignInFailed(f"The sign-in provider's {what} is not a JSON object.", 502)
        return document

    async def metadata(self) -> ProviderMetadata:
        """The provider's endpoints, read once from its discovery document (its issuer must be ours)."""
        async with self._lock:
            if self._metadata is None:
                document = await self._get_json(
                    f"{self.issuer}/.well-known/openid-configuration", "discovery document"
                )
                if document.get("issuer") != self.issuer:
                    raise SignInFailed(
                        f"The provider names itself {document.get('issuer')!r}, not {self.issuer!r}: "
                        "check MODGATE_OIDC__ISSUER.", 502,
                    )
                try:
                    self._metadata = ProviderMetadata(
                        authorization_endpoint=str(document["authorization_endpoint"]),
                        token_endpoint=str(document["token_endpoint"]),
                        jwks_uri=str(document["jwks_uri"]),
                        userinfo_endpoint=document.get("userinfo_endpoint"),
                        signing_algs=tuple(
                            alg for alg in document.get("id_token_signing_alg_values_supported", ["RS256"])
                            if alg in _SIGNING_ALGS
                        ),
                    )
                except KeyError as exc:
                    raise SignInFailed(f"The provider's discovery document lacks {exc}.", 502) from exc
            return self._metadata

    async def _key_set(self, refresh: bool = False) -> KeySet:
        metadata = await self.metadata()
        if self._keys is None or refresh:
            document = await self._get_json(metadata.jwks_uri, "signing keys")
            try:
                self._keys = KeySet.import_key_set(document)  # type: ignore[arg-type]  # checked by joserfc
            except (JoseError, KeyError, TypeError, ValueError) as exc:
                raise SignInFailed("The provider's signing keys cannot be read.", 502) from exc
        return self._keys

    async def begin(self) -> SignInStart:
        """A new sign-in: the authorization URL (code flow, S256 challenge, nonce) and the flow's secrets."""
        metadata = await self.metadata()
        state, nonce = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        verifier = secrets.token_urlsafe(48)  # 64 characters of [A-Za-z0-9_-]: within RFC 7636's 43-128
        url = prepare_grant_uri(
            metadata.authorization_endpoint, self.client_id, "code", redirect_uri=self.redirect_uri,
            scope=self.settings.scopes, state=state, nonce=nonce,
            code_challenge=create_s256_code_challenge(verifier), code_challenge_method="S256",
        )
        return SignInStart(str(url), {"state": state, "nonce": nonce, "verifier": verifier})

    async def finish(self, params: Mapping[str, str], flow: Mapping[str, Any]) -> Person:
        """The person behind the provider's answer (the callback's query), for the flow this browser began."""
        if "error" in params:
            detail = params.get("error_description") or params["error"]
            raise SignInFailed(f"The sign-in provider refused: {detail}", 401)
        state = str(flow.get("state", ""))
        if not state or not hmac.compare_digest(params.get("state", "").encode(), state.encode()):
            raise SignInFailed("This sign-in was not started from this browser (its state differs): "
                               "start again.", 401)
        if "iss" in params and params["iss"] != self.issuer:  # RFC 9207: the answer names its provider
            raise SignInFailed("The answer came from another provider.", 401)
        code = params.get("code")
        if not code:
            raise SignInFailed("The provider sent no authorization code.", 401)
        tokens = await self._exchange(code, str(flow.get("verifier", "")))
        claims = await self.verify_id_token(
            str(tokens.get("id_token", "")), str(flow.get("nonce", "")), tokens.get("access_token")
        )
        return self.person(await self._with_userinfo(claims, tokens.get("access_token")))

    async def _exchange(self, code: str, verifier: str) -> dict[str, Any]:
        """The token endpoint's answer for the code (RFC 6749 4.1.3 with RFC 7636's verifier)."""
        metadata = await self.metadata()
        body = prepare_token_request(
            "authorization_code", code=code, redirect_uri=self.redirect_uri, code_verifier=verifier
        )
        secret = self.settings.client_secret
        auth = ClientAuth(self.client_id, secret.get_secret_value() if secret else None,
                          "client_secret_basic" if secret else "none")
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        uri, headers, body = auth.prepare("POST", metadata.token_endpoint, headers, body)
        try:
            response = await self._http.post(
                uri, headers=headers, content=body, timeout=self.settings.timeout_s
            )
            answer = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.error("console: OpenID Connect token request failed: %s", exc)
            raise SignInFailed("The sign-in provider did not answer (token): try again.", 502) from exc
        if response.status_code != 200 or not isinstance(answer, dict) or "error" in answer:
            detail = ""
            if isinstance(answer, dict):
                detail = answer.get("error_description") or answer.get("error") or ""
            log.warning("console: the provider refused the code: %s %s", response.status_code, detail)
            raise SignInFailed(f"The sign-in provider refused the code ({detail or response.status_code}): "
                               "start again.", 401)
        return answer

    async def verify_id_token(self, raw: str, nonce: str, access_token: str | None = None) -> dict[str, Any]:
        """The ID token's claims once its signature (the issuer's keys) and claims (iss, aud, azp, exp, iat,
        nonce, at_hash) hold; :class:`SignInFailed` otherwise."""
        metadata = await self.metadata()
        if not raw or not nonce:
            raise SignInFailed("The provider sent no ID token.", 401)
        try:
            try:
                token = jwt.decode(raw, await self._key_set(), algorithms=metadata.signing_algs)
            except InvalidKeyIdError:  # a key published since we read the set: read it again, once
                token = jwt.decode(raw, await self._key_set(refresh=True), algorithms=metadata.signing_algs)
            claims = CodeIDToken(
                token.claims, token.header,
                options={"iss": {"essential": True, "value": self.issuer},
                         "aud": {"essential": True, "value": self.client_id}},
                params={"nonce": nonce, "client_id": self.client_id, "access_token": access_token},
            )
            claims.validate(now=int(self._clock()), leeway=LEEWAY_S)
        except JoseError as exc:  # a malformed token, a bad signature, an unknown key, a claim that fails
            log.warning("console: an ID token was refused: %s", exc)
            refusal = f"The ID token does not hold ({type(exc).__name__}): start again."
            raise SignInFailed(refusal, 401) from exc
        return dict(claims)

    async def _with_userinfo(self, claims: dict[str, Any], access_token: Any) -> dict[str, Any]:
        """The ID token's claims, completed from the userinfo endpoint when it lacks the roles or tenants."""
        wanted = (self.settings.roles_claim, self.settings.tenants_claim)
        metadata = await self.metadata()
        if all(claim_at(claims, name) is not None for name in wanted) or not metadata.userinfo_endpoint:
            return claims
        if not isinstance(access_token, str) or not access_token:
            return claims
        info = await self._get_json(metadata.userinfo_endpoint, "userinfo",
                                    headers={"Authorization": f"Bearer {access_token}"})
        if info.get("sub") != claims.get("sub"):  # OpenID Connect Core 5.3.2: else it may be substituted
            raise SignInFailed("The provider's userinfo is about someone else.", 401)
        return {**info, **claims}

    def person(self, claims: Mapping[str, Any]) -> Person:
        """The role and tenants in a person's claims (403 when they hold no modgate role)."""
        subject = str(claims.get("sub", ""))
        roles = set(_names(claim_at(claims, self.settings.roles_claim)))
        # an address names someone only when the provider verified it (OpenID Connect Core 5.1): anyone may
        # type another's address at sign-up
        verified = claims.get("email_verified") in (True, "true")
        name = next((str(claims[key]) for key in ("email", "preferred_username")
                     if (key != "email" or verified)
                     and isinstance(claims.get(key), str) and OPERATOR_NAME.match(claims[key])), "user")
        token_id = "oidc:" + (subject if _SUBJECT.match(subject)
                              else hashlib.sha256(subject.encode()).hexdigest()[:16])
        if self.settings.operator_role in roles:
            return Person(name, token_id, "operator", None)
        if self.settings.reviewer_role in roles:
            tenants = frozenset(_names(claim_at(claims, self.settings.tenants_claim)))
            return Person(name, token_id, "reviewer", tenants)
        log.warning("console: %s (%s) signed in at the provider but holds no modgate role", name, token_id)
        raise SignInFailed(
            f"You signed in as {name}, but your account has neither the {self.settings.operator_role!r} "
            f"nor the {self.settings.reviewer_role!r} role: ask an administrator.", 403,
        )
