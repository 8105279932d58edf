"""Who a business request is for, as every stage after the HTTP edge sees it (authenticated there)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated business caller."""

    tenant: str
    key_id: str  # the first 8 hex digits of the key's digest: safe to log
    job_id: str | None = None  # the async job a worker moderates for (a review label is written beside it)
