"""The console's ID token checks, on real ID tokens from the provider (tests/oidc/provider.mjs): a token
altered, signed by another key, expired, for another client, or answering another nonce is refused."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from gateway.console_settings import OidcSettings
from gateway.http.console.oidc import OidcSignIn, SignInFailed
from tests.oidc.support import PUBLIC_CLIENT, SCOPES, OidcProvider, through_provider

REDIRECT_BASE = "http://127.0.0.1:9"  # never served: the test takes the code from the provider's redirect


@dataclass(frozen=True)
class IssuedTokens:
    """What the provider's token endpoint answered for one sign-in, and the nonce that sign-in sent."""

    id_token: str
    access_token: str
    nonce: str


def relying_party(
    provider: OidcProvider, http: httpx.AsyncClient, client_id: str = PUBLIC_CLIENT,
    clock: Callable[[], float] = time.time,
) -> OidcSignIn:
    """The console's relying party for the provider's public client (no secret: PKCE alone)."""
    settings = OidcSettings(issuer=provider.issuer, client_id=client_id, redirect_base_url=REDIRECT_BASE,
                            scopes=SCOPES)
    return OidcSignIn(settings, http, clock)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=15) as client:
        yield client


@pytest.fixture
async def issued(oidc_provider: OidcProvider, http: httpx.AsyncClient) -> IssuedTokens:
    """A real sign-in as rita: the console's authorization request, the provider's pages, the code
    exchanged at the token endpoint with the PKCE verifier."""
    oidc = relying_party(oidc_provider, http)
    start = await oidc.begin()
    with httpx.Client(timeout=15) as browser:
        back = through_provider(browser, start.url, "rita", stop_at=oidc.redirect_uri)
    query = parse_qs(urlsplit(back.headers["location"]).query)
    assert query["state"] == [start.flow["state"]]
    metadata = await oidc.metadata()
    answer = await http.post(metadata.token_endpoint, data={
        "grant_type": "authorization_code", "code": query["code"][0], "redirect_uri": oidc.redirect_uri,
        "code_verifier": start.flow["verifier"], "client_id": PUBLIC_CLIENT,
    })
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    return IssuedTokens(tokens["id_token"], tokens["access_token"], start.flow["nonce"])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _parts(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    header, payload, signature = token.split(".")
    return (json.loads(base64.urlsafe_b64decode(header + "==")),
            json.loads(base64.urlsafe_b64decode(payload + "==")), signature)


async def test_the_providers_id_token_holds(
    oidc_provider: OidcProvider, http: httpx.AsyncClient, issued: IssuedTokens
) -> None:
    claims = await relying_party(oidc_provider, http).verify_id_token(
        issued.id_token, issued.nonce, issued.access_token
    )
    assert (claims["sub"], claims["aud"], claims["iss"]) == ("rita", PUBLIC_CLIENT, oidc_provider.issuer)


async def test_an_id_token_answering_another_nonce_is_refused(
    oidc_provider: OidcProvider, http: httpx.AsyncClient, issued: IssuedTokens
) -> None:
    with pytest.raises(SignInFailed, match="does not hold"):
        await relying_party(oidc_provider, http).verify_id_token(issued.id_token, "another-nonce")


async def test_an_id_token_for_another_client_is_refused(
    oidc_provider: OidcProvider, http: httpx.AsyncClient, issued: IssuedTokens
) -> None:
    with pytest.raises(SignInFailed, match="does not hold"):
        await relying_party(oidc_provider, http, client_id="modgate-console").verify_id_token(
            issued.id_token, issued.nonce
        )


async def test_an_expired_id_token_is_refused(
    oidc_provider: OidcProvider, http: httpx.AsyncClient, issued: IssuedTokens
) -> None:
    _, claims, _ = _parts(issued.id_token)
    later = float(claims["exp"]) + 120  # past the minute of clock difference the check allows
    with pytest.raises(SignInFailed, match="ExpiredTokenError"):
        await relying_party(oidc_provider, http, clock=lambda: later).verify_id_token(
            issued.id_token, issued.nonce
        )


def _altered(token: str) -> str:
    """The provider's signature over claims changed afterwards (the subject made someone else's)."""
    header, _, signature = token.split(".")
    _, claims, _ = _parts(token)
    return f"{header}.{_b64(json.dumps({**claims, 'sub': 'olivia'}).encode())}.{signature}"


def _signed_by_an_impostor(token: str) -> str:
    """The same claims signed by another RSA key that claims the provider's key id."""
    header, claims, _ = _parts(token)
    impostor = RSAKey.generate_key(2048, {"kid": header["kid"]})
    return jwt.encode({"alg": "RS256", "kid": header["kid"]}, claims, impostor)


def _unsigned(token: str) -> str:
    """The same claims with ``alg: none`` and no signature."""
    _, claims, _ = _parts(token)
    return ".".join((_b64(json.dumps({"alg": "none"}).encode()), _b64(json.dumps(claims).encode()), ""))


@pytest.mark.parametrize(("forge", "error"), [
    (_altered, "BadSignatureError"),
    (_signed_by_an_impostor, "BadSignatureError"),
    (_unsigned, "does not hold"),
], ids=["claims-altered", "another-key-same-kid", "unsigned"])
async def test_a_forged_id_token_is_refused(
    oidc_provider: OidcProvider, http: httpx.AsyncClient, issued: IssuedTokens,
    forge: Callable[[str], str], error: str,
) -> None:
    with pytest.raises(SignInFailed, match=error):
        await relying_party(oidc_provider, http).verify_id_token(forge(issued.id_token), issued.nonce)
