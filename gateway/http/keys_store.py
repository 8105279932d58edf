"""Business API keys kept in Redis, digests only: ``HSET modgate:api_keys <sha256-hex> <tenant>``.

A key is shown once, when ``modgate keys add`` makes it; Redis never holds it, only its SHA-256 digest, so a
copy of Redis gives no usable key. Lookup is by digest (a hash-table lookup on a digest the caller cannot
steer leaks nothing useful through its timing). ``modgate keys list`` shows a key id (the digest's first 12
hex digits) and its tenant; ``modgate keys revoke`` takes that id or the key itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Final, TypeVar

import redis.asyncio as aioredis
import typer
from redis.exceptions import RedisError

from gateway.errors import StateUnavailable
from gateway.renamed_settings import option_envvars, warn_if_read_by_old_name
from gateway.state import open_redis

API_KEYS_HASH: Final = "modgate:api_keys"
KEY_PREFIX: Final = "mg_"
KEY_ID_LENGTH: Final = 12
_TENANT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
T = TypeVar("T")


def key_digest(key: str) -> str:
    """The SHA-256 hex digest a key is stored and looked up by."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_api_key() -> str:
    """A fresh key: ``mg_`` and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class StoredKey:
    """What ``list`` shows of a key: never the key itself."""

    key_id: str
    tenant: str


class RedisKeyStore:
    """API key digests → tenants, in one Redis hash."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client

    async def tenant_for_digest(self, digest_hex: str) -> str | None:
        """The tenant of a key digest, or None; 503 when Redis cannot be asked."""
        try:
            tenant = await self._redis.hget(API_KEYS_HASH, digest_hex)
        except RedisError as exc:
            raise StateUnavailable("cannot check the API key: the key store (Redis) is unreachable") from exc
        return None if tenant is None else _text(tenant)

    async def add(self, tenant: str) -> str:
        """Make a key for ``tenant``, store its digest, and answer the key (shown to the operator once)."""
        if not _TENANT.fullmatch(tenant):
            raise ValueError(f"a tenant name is 1 to 64 letters, digits, '.', '_' or '-', got {tenant!r}")
        key = new_api_key()
        await self._redis.hset(API_KEYS_HASH, key_digest(key), tenant)
        return key

    async def list(self) -> list[StoredKey]:
        """Every stored key's id and tenant, sorted by tenant."""
        entries = await self._redis.hgetall(API_KEYS_HASH)
        keys = [StoredKey(_text(digest)[:KEY_ID_LENGTH], _text(tenant)) for digest, tenant in entries.items()]
        return sorted(keys, key=lambda k: (k.tenant, k.key_id))

    async def revoke(self, key_or_id: str) -> StoredKey:
        """Remove one key, named by the key itself or by its id (a digest prefix of at least 8 digits)."""
        digests = [_text(d) for d in await self._redis.hkeys(API_KEYS_HASH)]
        wanted = key_digest(key_or_id)
        if wanted in digests:
            matches = [wanted]
        elif re.fullmatch(r"[0-9a-f]{8,64}", key_or_id):
            matches = [d for d in digests if d.startswith(key_or_id)]
        else:
            matches = []
        if not matches:
            raise LookupError("no such key")
        if len(matches) > 1:
            raise LookupError(f"{len(matches)} keys have an id starting with {key_or_id!r}: give more digits")
        tenant = await self._redis.hget(API_KEYS_HASH, matches[0])
        await self._redis.hdel(API_KEYS_HASH, matches[0])
        return StoredKey(matches[0][:KEY_ID_LENGTH], "" if tenant is None else _text(tenant))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- ``modgate keys add|revoke|list`` ------------------------------------------------------------------

keys_app = typer.Typer(
    help="Business API keys kept in Redis (digests only); the gateway reads them with "
    "MODGATE_AUTH__API_KEYS_FROM_REDIS=true.",
    no_args_is_help=True,
)

REDIS_URL = "MODGATE_REDIS__URL"
RedisUrl = Annotated[
    str | None,
    typer.Option("--redis-url", envvar=option_envvars(REDIS_URL), show_default=False,
                 callback=warn_if_read_by_old_name(REDIS_URL),
                 help=f"The gateway's Redis (default: {REDIS_URL})."),
]


def with_redis(redis_url: str | None, action: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    """Run a command's action on a Redis client of its own, closed afterwards; a readable exit on trouble."""
    if not redis_url:
        typer.secho("set MODGATE_REDIS__URL or pass --redis-url", fg="red", err=True)
        raise typer.Exit(2)

    async def run() -> T:
        client = open_redis(redis_url, socket_connect_timeout=3.0, socket_timeout=5.0)
        try:
            return await action(client)
        finally:
            await client.aclose()

    try:
        return asyncio.run(run())
    except RedisError as exc:
        typer.secho(f"Redis at {redis_url} failed: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc


def _run(redis_url: str | None, action: Callable[[RedisKeyStore], Awaitable[T]]) -> T:
    return with_redis(redis_url, lambda client: action(RedisKeyStore(client)))


@keys_app.command("add")
def add_key(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the key speaks for.")],
    redis_url: RedisUrl = None,
) -> None:
    """Make a key for a tenant and print it: this is the only time it is shown."""
    try:
        key = _run(redis_url, lambda store: store.add(tenant))
    except ValueError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from exc
    typer.echo(key)
    typer.secho(f"key id {key_digest(key)[:KEY_ID_LENGTH]} for tenant {tenant}: store the key now, it is not "
                "kept anywhere and cannot be shown again", err=True)


@keys_app.command("list")
def list_keys(redis_url: RedisUrl = None) -> None:
    """Every key's id and tenant (never the key)."""
    keys = _run(redis_url, lambda store: store.list())
    for stored in keys:
        typer.echo(f"{stored.key_id}  {stored.tenant}")
    if not keys:
        typer.secho("no keys in Redis", err=True)


@keys_app.command("revoke")
def revoke_key(
    key_or_id: Annotated[str, typer.Argument(help="The key itself, or its id from `modgate keys list`.")],
    redis_url: RedisUrl = None,
) -> None:
    """Remove a key; calls made with it get 401 from then on."""
    try:
        removed = _run(redis_url, lambda store: store.revoke(key_or_id))
    except LookupError as exc:
        typer.secho(str(exc.args[0]), fg="red", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"revoked {removed.key_id} ({removed.tenant})")
