"""Tenants: who they are (named by the API keys, never by a request) and their weights and quotas.

Limits come from the settings (``MODGATE_TENANTS__*``) and, beside the keys in Redis, from the hash
``modgate:tenants`` (tenant → JSON ``{"weight", "keyframes_per_minute", "max_concurrent"}``, written by
``modgate tenants set``); a Redis value overrides the settings' for its tenant. The directory re-reads Redis
every few seconds, so a change reaches every replica without a restart.

The tenant names are a bounded set because only keys make them: the settings' keys, the tenants of the keys
kept in Redis, the tenants given limits, and ``default`` when no key is required. Metrics label by these.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import redis.asyncio as aioredis
import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import RedisError

from gateway.http.keys_store import _TENANT, API_KEYS_HASH, RedisUrl, _text, with_redis
from gateway.settings import TenantSettings
from gateway.tasks import stop

log = logging.getLogger("modgate.tenants")
T = TypeVar("T")

ANONYMOUS_TENANT = "default"
"""The one tenant of a gateway that requires no API key."""


class StoredLimits(BaseModel):
    """A tenant's limits as Redis keeps them; a field left out falls back to the settings."""

    model_config = ConfigDict(extra="forbid")

    weight: float | None = Field(default=None, gt=0, le=1000)
    keyframes_per_minute: int | None = Field(default=None, ge=0)
    max_concurrent: int | None = Field(default=None, ge=0)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What a tenant may use: its weight in the fair share, and its quotas (0: none)."""

    weight: float
    keyframes_per_minute: int
    max_concurrent: int


class TenantDirectory:
    """Every known tenant and its limits: the settings, overridden by what Redis holds."""

    def __init__(self, settings: TenantSettings, key_tenants: set[str], redis: aioredis.Redis | None = None,
                 *, read_key_store: bool = False) -> None:
        self.settings = settings
        self._key_tenants = set(key_tenants)  # the settings' API keys' tenants (or {"default"})
        self._redis = redis
        self._read_key_store = read_key_store
        self._stored: dict[str, StoredLimits] = {}
        self._store_tenants: set[str] = set()  # tenants of keys kept in Redis
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.last_error: str | None = None

    def names(self) -> list[str]:
        """Every tenant known now, sorted."""
        configured = (set(self.settings.weights) | set(self.settings.keyframes_per_minute)
                      | set(self.settings.max_concurrent))
        return sorted(self._key_tenants | self._store_tenants | configured | set(self._stored))

    def limits(self, tenant: str) -> TenantLimits:
        """A tenant's weight and quotas now."""
        group = self.settings
        stored = self._stored.get(tenant, StoredLimits())
        return TenantLimits(
            weight=self.weight(tenant),
            keyframes_per_minute=(
                stored.keyframes_per_minute if stored.keyframes_per_minute is not None
                else group.keyframes_per_minute.get(tenant, group.default_keyframes_per_minute)
            ),
            max_concurrent=(
                stored.max_concurrent if stored.max_concurrent is not None
                else group.max_concurrent.get(tenant, group.default_max_concurrent)
            ),
        )

    def weight(self, tenant: str) -> float:
        """A tenant's weight in the fair share (asked on every engine call: read, not built as ``limits``)."""
        stored = self._stored.get(tenant)
        if stored is not None and stored.weight is not None:
            return stored.weight
        return self.settings.weights.get(tenant, self.settings.default_weight)

    async def reload(self) -> None:
        """Read the tenants' limits (and the key store's tenants) from Redis; keep the last on failure."""
        if self._redis is None:
            return
        try:
            entries = await self._redis.hgetall(self.settings.redis_key)
            tenants = await self._redis.hvals(API_KEYS_HASH) if self._read_key_store else []
        except RedisError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if reason != self.last_error:
                log.warning("cannot read tenant limits from Redis (%s): keeping the last known", reason)
            self.last_error = reason
            return
        self.last_error = None
        stored: dict[str, StoredLimits] = {}
        for raw_tenant, raw in entries.items():
            tenant = _text(raw_tenant)
            try:
                stored[tenant] = StoredLimits.model_validate_json(raw)
            except ValidationError as exc:
                log.error("tenant %s: unreadable limits in Redis, ignored: %s", tenant, exc)
        self._stored = stored
        self._store_tenants = {_text(tenant) for tenant in tenants}

    def start(self) -> None:
        """Read Redis now and every ``reload_interval_s`` seconds (nothing to do without Redis)."""
        if self._redis is not None and self._task is None:
            self._task = asyncio.create_task(self._reload_forever(), name="tenant-limits-reload")

    async def _reload_forever(self) -> None:
        # stops on the flag as well as the cancel: redis-py may turn a cancel into an error reload() absorbs
        while not self._stopping:
            await self.reload()
            await asyncio.sleep(self.settings.reload_interval_s)

    async def stop(self) -> None:
        """Stop reading Redis."""
        self._stopping = True
        await stop(self._task)
        self._task = None


class RedisTenantStore:
    """Tenant limits in one Redis hash (beside the API keys)."""

    def __init__(self, client: aioredis.Redis, key: str = "modgate:tenants") -> None:
        self._redis = client
        self.key = key

    async def set(self, tenant: str, limits: StoredLimits) -> StoredLimits:
        """Merge ``limits`` into what the tenant has (fields left None are kept); answers the result."""
        if not _TENANT.fullmatch(tenant):
            raise ValueError(f"a tenant name is 1 to 64 letters, digits, '.', '_' or '-', got {tenant!r}")
        raw = await self._redis.hget(self.key, tenant)
        current = StoredLimits() if raw is None else StoredLimits.model_validate_json(raw)
        merged = current.model_copy(update=limits.model_dump(exclude_none=True))
        await self._redis.hset(self.key, tenant, merged.model_dump_json(exclude_none=True))
        return merged

    async def clear(self, tenant: str) -> bool:
        """Remove a tenant's stored limits (the settings apply again); False if it had none."""
        return bool(await self._redis.hdel(self.key, tenant))

    async def all(self) -> dict[str, StoredLimits]:
        """Every tenant's stored limits."""
        entries = await self._redis.hgetall(self.key)
        return {_text(t): StoredLimits.model_validate_json(raw) for t, raw in sorted(entries.items())}


# --- ``modgate tenants set|list|clear`` ----------------------------------------------------------------

tenants_app = typer.Typer(
    help="Tenant weights and quotas kept in Redis beside the API keys (override MODGATE_TENANTS__*).",
    no_args_is_help=True,
)


def _run(redis_url: str | None, redis_key: str, action: Callable[[RedisTenantStore], Awaitable[T]]) -> T:
    return with_redis(redis_url, lambda client: action(RedisTenantStore(client, redis_key)))


RedisKey = Annotated[str, typer.Option("--redis-key", envvar="MODGATE_TENANTS__REDIS_KEY",
                                       help="The Redis hash (default: MODGATE_TENANTS__REDIS_KEY).")]


@tenants_app.command("set")
def set_limits(
    tenant: Annotated[str, typer.Argument(help="The tenant, as its API keys name it.")],
    weight: Annotated[float | None, typer.Option(help="Share of engine work against weight 1.")] = None,
    keyframes_per_minute: Annotated[int | None, typer.Option(help="Quota; 0: none.")] = None,
    max_concurrent: Annotated[int | None, typer.Option(help="Requests at once per replica; 0: none.")] = None,
    redis_url: RedisUrl = None,
    redis_key: RedisKey = "modgate:tenants",
) -> None:
    """Set a tenant's weight and quotas (values not given are kept); replicas read them within seconds."""
    try:
        limits = StoredLimits(weight=weight, keyframes_per_minute=keyframes_per_minute,
                              max_concurrent=max_concurrent)
        stored = _run(redis_url, redis_key, lambda store: store.set(tenant, limits))
    except (ValueError, ValidationError) as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"{tenant}  {stored.model_dump_json(exclude_none=True)}")


@tenants_app.command("list")
def list_limits(redis_url: RedisUrl = None, redis_key: RedisKey = "modgate:tenants") -> None:
    """Every tenant with limits in Redis."""
    stored = _run(redis_url, redis_key, lambda store: store.all())
    for tenant, limits in stored.items():
        typer.echo(f"{tenant}  {json.dumps(limits.model_dump(exclude_none=True))}")
    if not stored:
        typer.secho("no tenant limits in Redis", err=True)


@tenants_app.command("clear")
def clear_limits(
    tenant: Annotated[str, typer.Argument()],
    redis_url: RedisUrl = None,
    redis_key: RedisKey = "modgate:tenants",
) -> None:
    """Forget a tenant's limits in Redis: the settings' apply again."""
    removed = _run(redis_url, redis_key, lambda store: store.clear(tenant))
    typer.echo(f"cleared {tenant}" if removed else f"{tenant} had no limits in Redis")
