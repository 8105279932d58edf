"""The console's settings: the operations page and its sign-in (``MODGATE_CONSOLE__*``, ``MODGATE_OIDC__*``).

Groups of :class:`gateway.settings.Settings`, kept here so the settings module stays readable."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator


class ConsoleSettings(BaseModel):
    """The operations page at ``/console`` (gateway/http/console/), signed in with the admin token."""

    reports_dir: Path = Path("var/quality/reports")  # where `modgate quality report` writes its JSON
    session_ttl_s: float = Field(default=8 * 3600, ge=60, le=7 * 86400)  # a sign-in lasts a working day
    # Browsers keep a Secure cookie only from HTTPS (or localhost): turn off only behind plain HTTP on a
    # network you trust, where the session cookie could otherwise be read off the wire.
    cookie_secure: bool = True
    poll_interval_s: float = Field(default=3.0, ge=1, le=60)  # how often the open page refreshes its panels
    # Failed sign-ins before 429 (until the window that the first failure opened ends): from one address,
    # and from everyone together (many addresses guessing).
    sign_in_max_failures_per_client: int = Field(default=5, ge=1, le=1000)
    sign_in_max_failures: int = Field(default=50, ge=1, le=100_000)
    sign_in_window_s: float = Field(default=300.0, ge=1, le=86400)
    audit_rows: int = Field(default=15, ge=1, le=200)


class OidcSettings(BaseModel):
    """Console sign-in with OpenID Connect (off while the issuer is unset): people sign in as themselves."""

    # "https://login.example.com/realms/modgate": its discovery document is read at the first sign-in
    issuer: str | None = None
    client_id: str | None = None  # the console's client at the provider (code flow, with PKCE)
    client_secret: SecretStr | None = None  # unset: a public client (PKCE alone proves the code is ours)
    # The console's address as browsers reach it: <this>/console/oidc/callback is the registered redirect URI.
    redirect_base_url: str | None = None
    provider_name: str = Field(default="OpenID Connect", min_length=1, max_length=64)  # "Sign in with …"
    scopes: str = "openid email profile"  # add the scope that releases the roles and tenants claims, if any
    # Where the roles are: a claim name or a dotted path ("realm_access.roles"); a list or a spaced string.
    roles_claim: str = Field(default="roles", min_length=1)
    operator_role: str = Field(default="modgate-operator", min_length=1)  # the console and its changes
    reviewer_role: str = Field(default="modgate-reviewer", min_length=1)  # the review queue, own tenants only
    tenants_claim: str = Field(default="tenants", min_length=1)  # a reviewer's tenants (a list, or spaced)
    timeout_s: float = Field(default=10.0, gt=0, le=120)  # each call to the provider

    @field_validator("issuer", "redirect_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"MODGATE_OIDC__ISSUER and __REDIRECT_BASE_URL are http(s) URLs, got {value!r}")
        return value.strip().rstrip("/")

    @model_validator(mode="after")
    def _complete_when_on(self) -> OidcSettings:
        if self.issuer is not None and (not self.client_id or self.redirect_base_url is None):
            raise ValueError("MODGATE_OIDC__ISSUER needs MODGATE_OIDC__CLIENT_ID and __REDIRECT_BASE_URL")
        if self.operator_role == self.reviewer_role:
            raise ValueError("MODGATE_OIDC__OPERATOR_ROLE and __REVIEWER_ROLE must differ")
        return self
