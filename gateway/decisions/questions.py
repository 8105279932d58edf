"""The Decisions API's log: one row per ``POST /v1/decisions`` request (its questions, its answers, the model
and the policy version that answered them), beside the moderation decisions.

A row of its own, not a :class:`contracts.decisions.DecisionRow`: a question's answer is no moderation
action, and the moderation log's readers (the DSA export, the weekly report, the label agreement) count
actions. With Redis the rows go to ``<MODGATE_DECISIONS__STREAM>:questions`` (kept to about
:data:`KEPT_ROWS` entries), else to this process's memory. An append waits no longer than
``MODGATE_DECISIONS__REDIS_TIMEOUT_S``; one that fails is logged and counted in
``modgate_decisions_unlogged_total``, and the answer goes out either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from datetime import datetime
from typing import Any, Final, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.decisions.log import Unlogged
from gateway.settings import DecisionSettings

log = logging.getLogger("modgate.decisions")
KEPT_ROWS: Final = 1_000_000
"""Rows the stream keeps (trimmed approximately as it grows)."""


class QuestionRow(BaseModel):
    """One Decisions request, as the log keeps it."""

    model_config = ConfigDict(extra="forbid")

    decided_at: datetime
    request_id: str  # ``decr-…``
    tenant: str
    frame_sha256: list[str]  # the shaped images asked about (the frames themselves are never kept)
    questions: list[dict[str, Any]]  # as sent, each image part's URL replaced by its frame's hash
    answers: list[dict[str, Any]]  # as answered, in the questions' order
    model: str
    model_revision: str | None
    policy_version: int
    thinking: str
    thinking_rule: str
    latency_ms: float


@runtime_checkable  # the app's handlers take it as a dependency, which Litestar checks by isinstance
class QuestionLog(Protocol):
    """Where Decisions rows go."""

    async def append(self, row: QuestionRow) -> None:
        """Keep one row (never raises: a row that cannot be kept is counted)."""

    async def recent(self, count: int) -> list[QuestionRow]:
        """The last ``count`` rows, oldest first."""


class MemoryQuestionLog:
    """This process's rows (no Redis): the last :data:`KEPT_ROWS`."""

    def __init__(self) -> None:
        self.rows: deque[QuestionRow] = deque(maxlen=KEPT_ROWS)

    async def append(self, row: QuestionRow) -> None:
        """Keep the row."""
        self.rows.append(row)

    async def recent(self, count: int) -> list[QuestionRow]:
        """The last ``count`` rows."""
        return list(self.rows)[-count:]


class RedisQuestionLog:
    """Rows on a Redis stream shared by every replica."""

    def __init__(self, client: Redis, settings: DecisionSettings, unlogged: Unlogged | None = None) -> None:
        self._redis = client
        self.settings = settings
        self.stream = f"{settings.stream}:questions"
        self._unlogged = unlogged

    async def append(self, row: QuestionRow) -> None:
        """XADD the row within the timeout; a failure is logged and counted, never raised."""
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                await self._redis.xadd(
                    self.stream, {"row": row.model_dump_json()}, maxlen=KEPT_ROWS, approximate=True
                )
        except (RedisError, OSError, TimeoutError) as exc:
            if self._unlogged is not None:
                self._unlogged(1)
            log.error("the decision log did not take a Decisions row: %s", exc,
                      extra={"request_id": row.request_id})

    async def recent(self, count: int) -> list[QuestionRow]:
        """The last ``count`` rows, oldest first."""
        raw: Any = await self._redis.xrevrange(self.stream, count=count)
        rows = []
        for _, fields in reversed(raw or []):
            value = fields.get(b"row", fields.get("row")) if isinstance(fields, dict) else None
            rows.append(QuestionRow.model_validate_json(value or b""))
        return rows
