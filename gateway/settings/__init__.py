"""Gateway settings, read from the environment: every setting is ``MODGATE_<GROUP>__<NAME>``.

The root ``Settings`` lives here; its groups beside it, by what they configure (``engine``, ``request_path``,
``background``, ``process``), re-exported so that ``from gateway.settings import X`` keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.console_settings import ConsoleSettings, OidcSettings
from gateway.renamed_settings import RenamedAttributes, nest_renamed_update
from gateway.settings.background import (
    DecisionSettings,
    JobSettings,
    QualitySettings,
    ReviewSettings,
    ShadowSettings,
    VideoSettings,
)
from gateway.settings.engine import (
    KIND_SETTINGS,
    AdmissionSettings,
    CircuitSettings,
    EngineSettings,
    KindSetting,
    LeaseSettings,
    SimulatorSettings,
)
from gateway.settings.process import AuthSettings, RedisSettings, ServerSettings, TelemetrySettings
from gateway.settings.request_path import (
    HostList,
    LimitsSettings,
    PolicySettings,
    RemoteImageSettings,
    ShapingSettings,
    TenantSettings,
)

__all__ = [
    "KIND_SETTINGS", "AdmissionSettings", "AuthSettings", "CircuitSettings", "ConsoleSettings",
    "DecisionSettings", "EngineSettings", "HostList", "JobSettings", "KindSetting", "LeaseSettings",
    "LimitsSettings", "OidcSettings", "PolicySettings", "QualitySettings", "RedisSettings",
    "RemoteImageSettings", "ReviewSettings", "ServerSettings", "Settings", "ShadowSettings",
    "ShapingSettings", "SimulatorSettings", "TelemetrySettings", "TenantSettings", "VideoSettings",
]


class Settings(RenamedAttributes, BaseSettings):
    """Everything the gateway reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="MODGATE_", env_nested_delimiter="__", extra="ignore")

    server: ServerSettings = ServerSettings()
    engine: EngineSettings = EngineSettings()
    redis: RedisSettings = RedisSettings()
    auth: AuthSettings = AuthSettings()
    admission: AdmissionSettings = AdmissionSettings()
    shaping: ShapingSettings = ShapingSettings()
    simulator: SimulatorSettings = SimulatorSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    circuit: CircuitSettings = CircuitSettings()
    limits: LimitsSettings = LimitsSettings()
    remote_images: RemoteImageSettings = RemoteImageSettings()
    jobs: JobSettings = JobSettings()
    videos: VideoSettings = VideoSettings()
    policy: PolicySettings = PolicySettings()
    console: ConsoleSettings = ConsoleSettings()
    oidc: OidcSettings = OidcSettings()
    leases: LeaseSettings = LeaseSettings()
    quality: QualitySettings = QualitySettings()
    shadow: ShadowSettings = ShadowSettings()
    tenants: TenantSettings = TenantSettings()
    review: ReviewSettings = ReviewSettings()
    decisions: DecisionSettings = DecisionSettings()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; an old flat name (``engine_url``) updates its group's field."""
        return super().model_copy(update=update and nest_renamed_update(self, update), deep=deep)

    @model_validator(mode="after")
    def _groups_agree(self) -> Settings:
        if self.auth.api_keys_from_redis and not self.redis.url:
            raise ValueError("MODGATE_AUTH__API_KEYS_FROM_REDIS needs MODGATE_REDIS__URL")
        if self.oidc.issuer is not None and self.auth.admin_token is None:
            raise ValueError(
                "MODGATE_OIDC__ISSUER needs MODGATE_AUTH__ADMIN_TOKEN (it signs console sessions)")
        if (self.redis.url or "").startswith("redis+sentinel:"):  # accepted: on a replica, failover or not
            for name in ("jobs", "review", "decisions"):  # WAIT_REPLICAS unset: 1; a value set stands (0 too)
                if "wait_replicas" not in getattr(self, name).model_fields_set:
                    setattr(self, name, getattr(self, name).model_copy(update={"wait_replicas": 1}))
        return self

    def tenant_keys(self) -> dict[str, str]:
        """The configured API keys, mapped to their tenant."""
        if self.auth.api_keys is None:
            return {}
        pairs = (item.strip().partition(":") for item in self.auth.api_keys.split(","))
        return {key: tenant for key, _, tenant in pairs}
