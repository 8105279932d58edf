"""Review items in Redis: a stream per tenant with one consumer group, a consumer per reviewer, a hash per
item with the retention as its TTL, and Lua for the steps that must be atomic (gateway/review/__init__.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from dataclasses import asdict
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.review.models import (
    ConflictKind,
    Label,
    LabelledItem,
    QueuedItem,
    ReviewConflict,
    ReviewItem,
    TenantQueue,
    audit_entry,
)
from gateway.stream_store import RedisStreamStore

PREFIX: Final = "modgate:review"
GROUP: Final = "reviewers"
TENANTS: Final = f"{PREFIX}:tenants"
AUDIT: Final = f"{PREFIX}:audit"  # the labels' audit trail, newest first
_SCAN_LIMIT: Final = 1000  # stream entries looked at per claim before answering "none" (expired ones skipped)
# The consumer an entry is parked with when the reviewer it was read for had its decision's other item (a
# double-labelled decision's twin): pending, held by no one, the next claim of another reviewer takes it.
PARKED: Final = "~parked"  # named as such in the scripts below
_PARKED_SCAN: Final = 100  # parked entries looked at per claim

# KEYS: item hash, tenant stream, tenants set. ARGV: group, item id, tenant, ttl, field/value pairs…
_ENQUEUE: Final = """
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
local entry = redis.call('XADD', KEYS[2], '*', 'item', ARGV[2])
redis.call('HSET', KEYS[1], 'entry', entry, unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[3], ARGV[3])
return entry
"""
# KEYS: item hash, tombstone, tenant stream (label: and the audit list). ARGV: group, reviewer, then (label
# only) the label JSON, its ttl, the audit entry and the audit's length.
# The holder is the consumer the entry is pending to: a claim taken over after its timeout has moved.
_HOLDER: Final = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'labelled'} end
local entry = redis.call('HGET', KEYS[1], 'entry')
if not entry then return {'gone'} end
local pending = redis.call('XPENDING', KEYS[3], ARGV[1], entry, entry, 1)
if #pending == 0 or pending[1][2] == '~parked' then return {'unclaimed'} end
if pending[1][2] ~= ARGV[2] then return {'claimed'} end
"""
_LABEL: Final = _HOLDER + """
redis.call('XACK', KEYS[3], ARGV[1], entry)
redis.call('XDEL', KEYS[3], entry)
redis.call('HDEL', KEYS[1], 'frame', 'entry')
local fields = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
redis.call('LPUSH', KEYS[4], ARGV[5])
redis.call('LTRIM', KEYS[4], 0, ARGV[6] - 1)
return {'ok', unpack(fields)}
"""
_RELEASE: Final = _HOLDER + """
redis.call('XACK', KEYS[3], ARGV[1], entry)
redis.call('XDEL', KEYS[3], entry)
local moved = redis.call('XADD', KEYS[3], '*', 'item', ARGV[3])
redis.call('HSET', KEYS[1], 'entry', moved)
return {'ok'}
"""

# KEYS: the decision's hash of who was handed which of its items. ARGV: reviewer, item id, ttl. 1: the item
# is this reviewer's now; 0: they were handed another item of the same decision (they hold or labelled it).
_HAND: Final = """
local had = redis.call('HGET', KEYS[1], ARGV[1])
if had and had ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""
# KEYS: tenant stream. ARGV: group, entry, reviewer. Takes a parked entry if it is still parked (two
# reviewers may reach for it at once).
_UNPARK: Final = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= '~parked' then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2])
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisReviewStore(RedisStreamStore):
    """Durable review items: streams, one consumer group, a consumer per reviewer (see the module doc)."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        claim_timeout_s: float,
        retention_s: int,
        audit_max_entries: int = 10_000,
        clock: Callable[[], float] = time.time,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 200,
    ) -> None:
        # wait_replicas: replicas that must hold an item before enqueue returns True
        super().__init__(client, name="the review queue", group=GROUP, wait_replicas=wait_replicas,
                         wait_timeout_ms=wait_timeout_ms)
        self.audit_max_entries = audit_max_entries
        self.claim_timeout_ms = max(1, int(claim_timeout_s * 1000))
        self.retention_s = retention_s
        self._clock = clock
        self._turn = 0  # the tenant a claim looks at first: turns, so a busy tenant starves no other
        self._enqueue = self._script(_ENQUEUE)
        self._label = self._script(_LABEL)
        self._release = self._script(_RELEASE)
        self._hand = self._script(_HAND)
        self._unpark = self._script(_UNPARK)

    @staticmethod
    def stream_key(tenant: str) -> str:
        """The tenant's stream."""
        return f"{PREFIX}:stream:{tenant}"

    @staticmethod
    def item_key(item_id: str) -> str:
        """The item's hash (frame, verdict, stream entry)."""
        return f"{PREFIX}:item:{item_id}"

    @staticmethod
    def handed_key(decision_key: str) -> str:
        """Which reviewer was handed which item of a decision (a double-labelled one has two)."""
        return f"{PREFIX}:handed:{decision_key}"

    @staticmethod
    def tombstone_key(item_id: str) -> str:
        """Left by a label (no frame): a second label is refused."""
        return f"{PREFIX}:labelled:{item_id}"

    async def enqueue(self, item: ReviewItem) -> bool:
        """Hash, stream entry and tenant in one script, then ``WAIT`` for ``wait_replicas`` replicas (if any):
        False when fewer held it in ``wait_timeout_ms`` (it is queued on the primary all the same)."""
        pairs = [value for pair in item.to_hash().items() for value in pair]
        async with self._unreachable("queue the frame for review"):
            _, holding = await self._run_replicated(
                self._enqueue, [self.item_key(item.id), self.stream_key(item.tenant), TENANTS],
                [GROUP, item.id, item.tenant, self.retention_s, *pairs],
            )
        return holding >= self.wait_replicas

    async def _tenants(self, scope: Collection[str] | None) -> list[str]:
        known = sorted(_text(t) for t in await self._redis.smembers(TENANTS))
        return [t for t in known if scope is None or t in scope]

    async def claim(self, reviewer: str, tenants: Collection[str] | None) -> ReviewItem | None:
        """Per tenant in turn: a claim past its timeout (``XAUTOCLAIM``), else a new entry (``XREADGROUP``);
        entries whose item expired are acknowledged and dropped on the way."""
        async with self._unreachable("claim a review item"):
            order = await self._tenants(tenants)
            if not order:
                return None
            self._turn = (self._turn + 1) % len(order)
            for tenant in order[self._turn:] + order[: self._turn]:
                item = await self._claim_from(self.stream_key(tenant), reviewer)
                if item is not None:
                    return item
        return None

    async def _claim_from(self, stream: str, reviewer: str) -> ReviewItem | None:
        """The stream's next item for ``reviewer``: one whose decision they were handed another item of is
        parked (:data:`PARKED`) for someone else, one whose item expired is dropped."""
        for _ in range(_SCAN_LIMIT):
            entries = await self._next_entries(stream, reviewer)
            if not entries:
                return None
            entry_id, values = entries[0]
            item = await self._item_of(stream, entry_id, values)
            if item is None:
                continue
            handed = await self._hand(keys=[self.handed_key(item.decision_key)],
                                      args=[reviewer, item.id, self.retention_s])
            if handed:
                return item
            await self._redis.xclaim(stream, GROUP, PARKED, 0, [entry_id])
        return None

    async def _item_of(self, stream: str, entry_id: Any, values: Any) -> ReviewItem | None:
        """The live item of a stream entry; None (and the entry dropped) when its item expired."""
        item_id = _text((values or {}).get(b"item") or (values or {}).get("item") or "")
        raw = await self._redis.hgetall(self.item_key(item_id)) if item_id else {}
        if raw and _text(raw.get(b"entry", b"")) == _text(entry_id):
            return ReviewItem.from_hash({k: v for k, v in raw.items() if k != b"entry"})
        # the item expired (or this entry is a stale copy): nothing to review
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            await pipe.execute()
        return None

    async def _from_parked(self, stream: str, reviewer: str) -> list[Any]:
        """The oldest parked entry whose decision ``reviewer`` was not handed yet, now pending to them."""
        parked = await self._redis.xpending_range(
            stream, GROUP, min="-", max="+", count=_PARKED_SCAN, consumername=PARKED)
        for pending in parked:
            entry_id = pending["message_id"]
            found: list[Any] = await self._redis.xrange(stream, min=entry_id, max=entry_id, count=1) or []
            item_id = _text((found[0][1] or {}).get(b"item", b"")) if found else ""
            raw = await self._redis.hgetall(self.item_key(item_id)) if item_id else {}
            if not raw:
                continue  # expired: dropped when a claim reads it as its own
            item = ReviewItem.from_hash({k: v for k, v in raw.items() if k != b"entry"})
            had = await self._redis.hget(self.handed_key(item.decision_key), reviewer)
            if (had is None or _text(had) == item.id) and await self._unpark(
                    keys=[stream], args=[GROUP, entry_id, reviewer]):
                return found
        return []

    async def _next_entries(self, stream: str, reviewer: str) -> list[Any]:
        try:
            claimed = await self._redis.xautoclaim(
                stream, GROUP, reviewer, self.claim_timeout_ms, "0-0", count=1
            )
            if len(claimed) > 1 and claimed[1]:
                return list(claimed[1])
            parked = await self._from_parked(stream, reviewer)
            if parked:
                return parked
            answer: Any = await self._redis.xreadgroup(GROUP, reviewer, {stream: ">"}, count=1)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._create_group(stream)
            return []
        return [entry for _, stream_entries in answer or [] for entry in stream_entries]

    async def peek(self, item_id: str) -> QueuedItem | None:
        """The item's hash, and the consumer its stream entry is pending to (none: not claimed)."""
        async with self._unreachable("read the review item"):
            raw = await self._redis.hgetall(self.item_key(item_id))
            if not raw or b"entry" not in raw:
                return None
            item = ReviewItem.from_hash({k: v for k, v in raw.items() if k != b"entry"})
            entry = _text(raw[b"entry"])
            pending = await self._redis.xpending_range(
                self.stream_key(item.tenant), GROUP, min=entry, max=entry, count=1
            )
        holder = _text(pending[0]["consumer"]) if pending else None
        return QueuedItem(item, None if holder == PARKED else holder)

    async def _tenant_of(self, item_id: str, tenants: Collection[str] | None) -> str | None:
        """The item's tenant (None: no such item now); a tenant outside ``tenants``: gone for this caller."""
        raw = await self._redis.hget(self.item_key(item_id), "tenant")
        tenant: str | None = json.loads(_text(raw)) if raw else None
        if tenant is not None and tenants is not None and tenant not in tenants:
            raise ReviewConflict(item_id, "gone")
        return tenant

    async def _run(self, script: Any, item_id: str, args: list[Any], tenant: str | None) -> list[Any]:
        answer: list[Any] = await script(
            keys=[self.item_key(item_id), self.tombstone_key(item_id), self.stream_key(tenant or "-"), AUDIT],
            args=[GROUP, *args],
        )
        status = _text(answer[0])
        if status != "ok":
            kind: ConflictKind = status  # type: ignore[assignment]  # the scripts answer only these
            raise ReviewConflict(item_id, kind)
        return answer[1:]

    async def label(
        self, item_id: str, label: Label, tenants: Collection[str] | None = None
    ) -> LabelledItem:
        """Acknowledge, drop the frame and the item, leave the tombstone: one script."""
        label_json = json.dumps(asdict(label))
        async with self._unreachable("label the review item"):
            # the item's fields for the audit entry first (the script checks it is still the holder's)
            raw = {k: v for k, v in (await self._redis.hgetall(self.item_key(item_id))).items()
                   if k not in (b"frame", b"entry")}
            known = ReviewItem.from_hash(raw) if raw else None
            if known is not None and tenants is not None and known.tenant not in tenants:
                raise ReviewConflict(item_id, "gone")
            entry = json.dumps(audit_entry(known, label)) if known else "{}"
            fields = await self._run(
                self._label, item_id,
                [label.reviewer, label_json, self.retention_s, entry, self.audit_max_entries],
                tenant=known.tenant if known else None,
            )
        raw = dict(zip(fields[::2], fields[1::2], strict=True))
        return LabelledItem(ReviewItem.from_hash(raw), label)

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        """The labels, newest first."""
        async with self._unreachable("read the review audit"):
            entries = await self._redis.lrange(AUDIT, 0, limit - 1)
        return [json.loads(entry) for entry in entries]

    async def release(self, item_id: str, reviewer: str, tenants: Collection[str] | None = None) -> None:
        """Acknowledge and re-add at the stream's end, for any reviewer."""
        async with self._unreachable("give the review item back"):
            tenant = await self._tenant_of(item_id, tenants)
            await self._run(self._release, item_id, [reviewer, item_id], tenant)

    async def queues(self) -> dict[str, TenantQueue]:
        """Expired entries trimmed (``XTRIM MINID``: every entry older than the retention has expired), then
        per tenant the stream's length, its pending count and its first entry's age."""
        now_ms = int(self._clock() * 1000)
        figures: dict[str, TenantQueue] = {}
        async with self._unreachable("read the review queue"):
            for tenant in await self._tenants(None):
                stream = self.stream_key(tenant)
                await self._redis.xtrim(stream, minid=f"{now_ms - self.retention_s * 1000}-0")
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.xlen(stream)
                    pipe.xrange(stream, count=1)
                    pipe.xpending(stream, GROUP)
                    depth, first, pending = await pipe.execute(raise_on_error=False)
                if isinstance(depth, Exception) or not depth:
                    continue
                oldest_ms = int(_text(first[0][0]).split("-")[0]) if first else now_ms
                claimed = 0 if isinstance(pending, Exception) else int(pending["pending"]) - sum(
                    int(c["pending"]) for c in pending.get("consumers") or () if _text(c["name"]) == PARKED)
                figures[tenant] = TenantQueue(int(depth), min(claimed, int(depth)),
                                              max(0.0, (now_ms - oldest_ms) / 1000))
        return figures
