"""Who a business request is for, as every stage after the HTTP edge sees it (authenticated there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

JobKind = Literal["keyframes", "video"]
"""What a job moderates: posted keyframes, or a video the gateway cuts."""


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated business caller."""

    tenant: str
    key_id: str  # the first 8 hex digits of the key's digest: safe to log
    job_id: str | None = None  # the async job a worker moderates for (a review label is written beside it)
    job_kind: JobKind | None = None  # that job's kind: its requests are recorded under it, not as live calls
