"""The process's groups: its HTTP server, its Redis, who may call it, its telemetry."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator


class ServerSettings(BaseModel):
    """The gateway's own HTTP server: where it listens, how it logs and how it stops."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # How long an idle client connection stays open. Longer than the pools of common clients (httpx 5 s,
    # aiohttp 15 s, nginx's and AWS ALB's upstream 60 s, Go's net/http 90 s): a client then always drops an
    # idle connection before the server does, and never sends a request into one the server is closing
    # (the server's old 5 s equalled httpx's expiry: "Server disconnected without sending a response").
    keep_alive_s: int = Field(default=120, ge=1, le=3600)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # After SIGTERM: seconds /readyz answers 503 while requests are still served (gateway/drain.py).
    drain_s: float = Field(default=5.0, ge=0, le=600)
    model_name: str = "modgate-moderation"  # the name answered in the moderation response


class RedisSettings(BaseModel):
    """The Redis every replica shares: policy, keys, jobs, leases, reviews and the decision log."""

    url: str | None = None  # unset: in-memory state

    @field_validator("url")
    @classmethod
    def _url_well_formed(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        from gateway.state import check_redis_url  # redis-py is imported only where a URL is given

        check_redis_url(value.strip())  # redis://, rediss://, unix:// or redis+sentinel:// (gateway/state.py)
        return value.strip()


class AuthSettings(BaseModel):
    """Who may call the gateway: API keys for /v1, the admin token for /admin and the console."""

    api_keys: str | None = None  # "key1:tenant1,key2:tenant2"; unset: no key required (said loudly)
    api_keys_from_redis: bool = False  # also accept keys added with `modgate keys add`; keys always required
    # the bearer token of /admin and the console: at least 16 characters, else the gateway does not start
    admin_token: str | None = None

    @field_validator("api_keys")
    @classmethod
    def _api_keys_well_formed(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        for item in value.split(","):
            key, sep, tenant = item.strip().partition(":")
            if not sep or not key or not tenant:
                raise ValueError("MODGATE_AUTH__API_KEYS must look like 'key1:tenant1,key2:tenant2'")
        return value

    @field_validator("admin_token")
    @classmethod
    def _admin_token_long_enough(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if len(value) < 16:
            raise ValueError("MODGATE_AUTH__ADMIN_TOKEN must be at least 16 characters")
        return value


class TelemetrySettings(BaseModel):
    """Traces, metrics, logs and the recent-window figures (gateway/telemetry/: tracing.py, windows.py)."""

    otlp_endpoint: str | None = None  # "http://collector:4318": OTLP/HTTP traces and metrics; unset: none
    service_name: str = "modgate"
    # The window of GET /stats and of the windowed cache rates: long enough for stable percentiles, short
    # enough that a burst of probes an hour ago does not colour what production gets now.
    window_s: float = Field(default=300.0, gt=0, le=86400)
    engine_scrape_interval_s: float = Field(default=15.0, ge=0)  # reads of the engine's /metrics; 0: never
    json_logs: bool = False  # one JSON object per log line (request ids; never image bytes or keys)

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint_is_http(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"MODGATE_TELEMETRY__OTLP_ENDPOINT must start with http:// or https://, got {value!r}"
            )
        return value.rstrip("/")
