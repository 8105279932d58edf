"""Gateway settings, read from the environment with the ``MODGATE_`` prefix."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseModel):
    """How the gateway talks to the engine."""

    model: str = "auto"  # "auto": the first model the engine lists at /v1/models
    connect_timeout_s: float = Field(default=2.0, gt=0)
    first_token_timeout_s: float = Field(default=30.0, gt=0)
    total_timeout_s: float = Field(default=120.0, gt=0)
    connect_retries: int = Field(default=3, ge=0, le=10)
    max_completion_tokens_thinking: int = Field(default=512, ge=1)
    max_completion_tokens_direct: int = Field(default=64, ge=1)
    verdict_constraint: Literal["json_schema", "regex"] = "json_schema"
    use_priority: bool = False  # needs the engine started with --scheduling-policy priority


class AdmissionSettings(BaseModel):
    """The queue in front of the engine's in-flight cap."""

    queue_size: int = Field(default=256, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0)


class ShapingSettings(BaseModel):
    """How keyframes are shaped before they reach the engine."""

    pixels_per_token: Literal[28, 32] = 32
    image_token_budget: int = Field(default=660, ge=4)
    jpeg_quality: int = Field(default=90, ge=50, le=100)
    max_image_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_images_per_request: int = Field(default=16, ge=1)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    animated: Literal["refuse", "first_frame"] = "refuse"
    user_text: str = "请审核这张视频关键帧截图。"


class SimulatorSettings(BaseModel):
    """The built-in simulated engine, started when no engine URL is set."""

    preset: Literal["spark", "instant"] = "spark"
    time_scale: float = Field(default=0.02, ge=0)


class Settings(BaseSettings):
    """Everything the gateway reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="MODGATE_", env_nested_delimiter="__", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    engine_url: str | None = None  # unset: the built-in simulated engine
    redis_url: str | None = None  # unset: in-memory state
    max_inflight: int = Field(default=8, ge=1, le=1024)
    api_keys: str | None = None  # "key1:tenant1,key2:tenant2"; unset: no key required (said loudly)
    admin_token: str | None = None
    model_name: str = "modgate-moderation"  # the name answered in the moderation response
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    engine: EngineSettings = EngineSettings()
    admission: AdmissionSettings = AdmissionSettings()
    shaping: ShapingSettings = ShapingSettings()
    simulator: SimulatorSettings = SimulatorSettings()

    @field_validator("engine_url")
    @classmethod
    def _engine_url_is_http(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"MODGATE_ENGINE_URL must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    @field_validator("api_keys")
    @classmethod
    def _api_keys_well_formed(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        for item in value.split(","):
            key, sep, tenant = item.strip().partition(":")
            if not sep or not key or not tenant:
                raise ValueError("MODGATE_API_KEYS must look like 'key1:tenant1,key2:tenant2'")
        return value

    @field_validator("admin_token")
    @classmethod
    def _admin_token_long_enough(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if len(value) < 16:
            raise ValueError("MODGATE_ADMIN_TOKEN must be at least 16 characters")
        return value

    def tenant_keys(self) -> dict[str, str]:
        """The configured API keys, mapped to their tenant."""
        if self.api_keys is None:
            return {}
        pairs = (item.strip().partition(":") for item in self.api_keys.split(","))
        return {key: tenant for key, _, tenant in pairs}
