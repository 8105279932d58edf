"""The thinking policy: whether the model reasons before its verdict, chosen per request.

Thinking on costs ~95 output tokens per keyframe (decode-bound on the Spark, about 57 frames/min); off,
a handful (prefill-bound, about 130 frames/min). Operators flip it at runtime; every flip is versioned.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["on", "off"]


class ThinkingPolicy(BaseModel):
    """The policy document operators edit (``GET|PUT /admin/thinking-policy``)."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(default=1, ge=1)
    default_mode: Mode = "on"
    allow_caller_choice: bool = True  # a caller may ask for on/off (X-Modgate-Thinking) and get it
    max_completion_tokens_on: int = Field(default=512, ge=16, le=32768)
    max_completion_tokens_off: int = Field(default=64, ge=16, le=4096)
    thinking_token_budget: int | None = Field(default=None, ge=1, le=32768)
    shadow_share: float = Field(default=0.0, ge=0.0, le=1.0)
    updated_at: datetime | None = None
    updated_by: str | None = None

    def content_hash(self) -> str:
        """Hash of what the policy decides, without its bookkeeping fields."""
        body = self.model_dump(mode="json", exclude={"version", "updated_at", "updated_by"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What the policy may look at for one request."""

    tenant: str
    requested: Mode | None = None
    tags: tuple[str, ...] = ()
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ThinkingDecision:
    """The mode used and the rule that chose it."""

    mode: Mode
    rule: str
    max_completion_tokens: int
    thinking_token_budget: int | None
    policy_version: int


def decide(policy: ThinkingPolicy, context: RequestContext) -> ThinkingDecision:
    """Apply the policy to one request."""
    mode, rule = policy.default_mode, "default"
    if context.requested is not None and policy.allow_caller_choice:
        mode, rule = context.requested, "caller"
    return ThinkingDecision(
        mode=mode,
        rule=rule,
        max_completion_tokens=policy.max_completion_tokens_on if mode == "on" else policy.max_completion_tokens_off,
        thinking_token_budget=policy.thinking_token_budget if mode == "on" else None,
        policy_version=policy.version,
    )


class PolicyStore(Protocol):
    """Where the policy lives: memory by default, Redis when configured."""

    def current(self) -> ThinkingPolicy: ...

    async def replace(self, policy: ThinkingPolicy, actor: str, reason: str) -> ThinkingPolicy: ...


class MemoryPolicyStore:
    """One process's policy, in memory."""

    def __init__(self, initial: ThinkingPolicy | None = None) -> None:
        self._policy = initial or ThinkingPolicy()

    def current(self) -> ThinkingPolicy:
        """The policy in force."""
        return self._policy

    async def replace(self, policy: ThinkingPolicy, actor: str, reason: str) -> ThinkingPolicy:
        """Install a new document under the next version."""
        new = policy.model_copy(
            update={"version": self._policy.version + 1, "updated_at": datetime.now(UTC), "updated_by": actor}
        )
        self._policy = new
        return new
