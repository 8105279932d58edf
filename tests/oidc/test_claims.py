"""Who a person is, from the claims their provider gives: the role, a reviewer's tenants, the audit name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.console_settings import OidcSettings
from gateway.http.console.oidc import OidcSignIn, SignInFailed


@pytest.fixture
async def oidc() -> AsyncIterator[OidcSignIn]:
    """A relying party configured as for Keycloak's realm roles; the provider is never called here."""
    settings = OidcSettings(issuer="https://id.example.com", client_id="modgate",
                            redirect_base_url="https://modgate.example.com",
                            roles_claim="realm_access.roles", tenants_claim="modgate_tenants")
    async with httpx.AsyncClient() as http:
        yield OidcSignIn(settings, http)


def claims(**extra: Any) -> dict[str, Any]:
    return {"sub": "f81d4fae-7dec", "email": "rita@example.com", "email_verified": True, **extra}


@pytest.mark.parametrize("verified", [False, "false", None])
def test_an_email_the_provider_did_not_verify_does_not_name_the_person(
    oidc: OidcSignIn, verified: object
) -> None:
    said = claims(realm_access={"roles": ["modgate-reviewer"]}, preferred_username="rita.r")
    said = {**said, "email_verified": verified} if verified is not None else {
        key: value for key, value in said.items() if key != "email_verified"}
    person = oidc.person({**said, "email": "ceo@example.com"})  # anyone may type an address at sign-up
    assert person.name == "rita.r"


def test_a_reviewers_roles_and_tenants_come_from_nested_and_spaced_claims(oidc: OidcSignIn) -> None:
    person = oidc.person(claims(realm_access={"roles": ["staff", "modgate-reviewer"]},
                                modgate_tenants="tenant-a, tenant-b"))
    assert (person.role, person.tenants) == ("reviewer", frozenset({"tenant-a", "tenant-b"}))
    assert (person.name, person.token_id) == ("rita@example.com", "oidc:f81d4fae-7dec")


def test_the_operator_role_wins_and_sees_every_tenant(oidc: OidcSignIn) -> None:
    person = oidc.person(claims(realm_access={"roles": "modgate-reviewer modgate-operator"},
                                modgate_tenants=["tenant-a"]))
    assert (person.role, person.tenants) == ("operator", None)


def test_a_reviewer_without_tenants_sees_none_not_all(oidc: OidcSignIn) -> None:
    person = oidc.person(claims(realm_access={"roles": ["modgate-reviewer"]}))
    assert person.tenants == frozenset()


def test_someone_with_no_modgate_role_is_refused(oidc: OidcSignIn) -> None:
    with pytest.raises(SignInFailed) as refused:
        oidc.person(claims(roles=["modgate-operator"]))  # a top-level claim: not where this one looks
    assert refused.value.status == 403


def test_a_name_or_subject_the_audit_trail_cannot_show_is_replaced(oidc: OidcSignIn) -> None:
    person = oidc.person({"sub": "CN=Rita, O=Example", "email": "rita (admin:1a2b3c4d)",
                          "realm_access": {"roles": ["modgate-reviewer"]}})
    assert person.name == "user"
    assert person.token_id.startswith("oidc:")
    assert len(person.token_id) == len("oidc:") + 16
    assert " " not in person.token_id
