"""The thinking policy: whether the model reasons before its verdict, chosen per request.

Thinking on costs ~95 output tokens per keyframe (decode-bound on the Spark, about 57 frames/min); off,
a handful (prefill-bound, about 130 frames/min). A third mode, ``escalate``, judges with thinking off
first and asks again with thinking on only where the fast verdict is unsure (see
:class:`EscalationPolicy`). Operators flip it at runtime; every flip is versioned.

The document (:class:`ThinkingPolicy`) is shared by every replica and holds no runtime state; the load
rule's hysteresis lives per replica in :class:`QueueLoad`, because each replica sees its own queue.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.policy.moderation import ModerationPolicy
from shaping.verdict import DEFAULT_VERDICT_FORMAT, MODEL_CATEGORIES, VerdictFormat

log = logging.getLogger("modgate.policy")

Mode = Literal["on", "off", "escalate"]
EngineMode = Literal["on", "off"]  # what one engine request does; ``escalate`` is one or two of them
MODES: tuple[Mode, ...] = ("on", "off", "escalate")

# Fields that record who changed the document, not what it decides: outside the content hash and diffs.
BOOKKEEPING_FIELDS = frozenset({"version", "updated_at", "updated_by", "reason"})


class ThinkingRule(BaseModel):
    """A rule for some requests: by tenant, by source tag, by priority; the first matching rule applies.

    A request matches when every matcher the rule sets matches (a tenant in ``tenants``, at least one of
    its tags in ``tags``, its priority within the bounds; lower priority numbers are more urgent).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
    tenants: list[str] = Field(default_factory=list, max_length=256)
    tags: list[str] = Field(default_factory=list, max_length=64)
    priority_at_least: int | None = Field(default=None, ge=-10, le=10)
    priority_at_most: int | None = Field(default=None, ge=-10, le=10)
    mode: Mode | None = None  # None: the policy's default mode
    # None: callers may choose where the rule pins no mode and the policy allows it; a rule that pins a mode
    # keeps it unless it says ``allow_caller_choice: true`` (an operator pinning a mode means it).
    allow_caller_choice: bool | None = None
    keep_under_load: bool = False  # these requests keep their mode while the load rule turns thinking off

    @model_validator(mode="after")
    def _matches_something_and_does_something(self) -> Self:
        bounded = self.priority_at_least is not None or self.priority_at_most is not None
        if not (self.tenants or self.tags or bounded):
            raise ValueError(f"rule {self.name!r} matches every request: give tenants, tags or a priority "
                             "bound (the policy's default_mode is what applies to everything)")
        if (self.priority_at_least is not None and self.priority_at_most is not None
                and self.priority_at_least > self.priority_at_most):
            raise ValueError(f"rule {self.name!r}: priority_at_least is above priority_at_most")
        if self.mode is None and self.allow_caller_choice is None and not self.keep_under_load:
            raise ValueError(f"rule {self.name!r} changes nothing: "
                             "set mode, allow_caller_choice or keep_under_load")
        return self

    def matches(self, context: RequestContext) -> bool:
        """Whether this rule applies to a request."""
        if self.tenants and context.tenant not in self.tenants:
            return False
        if self.tags and not set(self.tags).intersection(context.tags):
            return False
        if self.priority_at_least is not None and context.priority < self.priority_at_least:
            return False
        return self.priority_at_most is None or context.priority <= self.priority_at_most

    def lets_caller_choose(self, policy_allows: bool) -> bool:
        """Whether a caller's requested mode is honoured under this rule."""
        if self.allow_caller_choice is not None:
            return self.allow_caller_choice
        return policy_allows and self.mode is None


class LoadRule(BaseModel):
    """Thinking off while this replica's queue is long, back on with hysteresis.

    Thinking goes off when any configured signal rises above its high mark and comes back on only once
    every configured signal is at or below its low mark, so the mode does not flap around one threshold
    (``queue_depth_low: 0``: back on once nobody waits).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    queue_depth_high: int | None = Field(default=None, ge=1)  # requests waiting for an engine slot
    queue_depth_low: int | None = Field(default=None, ge=0)
    queue_wait_ms_high: float | None = Field(default=None, gt=0)  # mean wait for a slot over window_s
    queue_wait_ms_low: float | None = Field(default=None, ge=0)
    window_s: float = Field(default=10.0, gt=0, le=600)

    @model_validator(mode="after")
    def _marks_are_pairs(self) -> Self:
        for signal in ("queue_depth", "queue_wait_ms"):
            high, low = getattr(self, f"{signal}_high"), getattr(self, f"{signal}_low")
            if (high is None) != (low is None):
                raise ValueError(f"load: {signal}_high and {signal}_low go together")
            if high is not None and low >= high:
                raise ValueError(f"load: {signal}_low must be below {signal}_high (hysteresis)")
        if self.enabled and self.queue_depth_high is None and self.queue_wait_ms_high is None:
            raise ValueError("load: an enabled load rule needs queue_depth_high/low "
                             "or queue_wait_ms_high/low")
        return self


class EscalationPolicy(BaseModel):
    """How ``escalate`` decides to ask again with thinking on, and how much of that it affords.

    A fast verdict is re-asked when it says ``review``, when its confidence (the engine's probability of
    its action) is below ``threshold`` or missing, or when it names one of ``always_categories``. The
    caps are per replica (each replica admits to its own engine slots): at most ``max_share`` of this
    replica's escalate-mode frames over the last ``window_s`` seconds, and at most ``max_per_minute``
    escalations in the last minute. ``cap_applies: under_load`` holds them only while requests wait for an
    engine slot on this replica (an idle engine re-asks every unsure frame); ``always`` holds them always.
    A frame the cap stops answers fast and says so (``modgate.escalation_skipped``).
    """

    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(default=0.85, ge=0, le=1)
    always_categories: list[str] = Field(default_factory=lambda: ["sexual/minors"], max_length=16)
    max_share: float | None = Field(default=0.4, gt=0, le=1)
    max_per_minute: float | None = Field(default=None, gt=0, le=100_000)
    window_s: float = Field(default=60.0, gt=0, le=3600)
    cap_applies: Literal["always", "under_load"] = "under_load"

    @model_validator(mode="after")
    def _known_categories(self) -> Self:
        unknown = sorted(set(self.always_categories) - set(MODEL_CATEGORIES))
        if unknown:
            raise ValueError(f"escalation.always_categories: unknown {', '.join(unknown)} "
                             f"(the model names {', '.join(MODEL_CATEGORIES)})")
        return self


class ThinkingPolicy(BaseModel):
    """The policy document operators edit (``GET|PUT /admin/thinking-policy``)."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(default=1, ge=1)
    default_mode: Mode = "on"
    allow_caller_choice: bool = True  # a caller may ask for on/off (X-Modgate-Thinking) and get it
    max_completion_tokens_on: int = Field(default=512, ge=16, le=32768)
    max_completion_tokens_off: int = Field(default=64, ge=16, le=4096)
    thinking_token_budget: int | None = Field(default=None, ge=1, le=32768)  # sent only with thinking on
    shadow_share: float = Field(default=0.0, ge=0.0, le=1.0)  # share of frames re-judged in the other mode
    # What the model writes: "compact" (allow / review / block:<categories>, a handful of tokens) or "json"
    # (the JSON object, ~27 tokens). A caller may ask for the other where it may choose the mode (the
    # quality module's format arms do); measure agreement before switching (docs/verdict-format.md).
    verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT
    rules: list[ThinkingRule] = Field(default_factory=list, max_length=100)
    load: LoadRule = Field(default_factory=LoadRule)
    escalation: EscalationPolicy = Field(default_factory=EscalationPolicy)  # what ``escalate`` does
    # Each tenant's moderation policy (gateway/policy/moderation.py): in this document so that it shares
    # its store, version counter, history, audit and propagation (``GET|PUT /admin/moderation-policy``)
    moderation: ModerationPolicy = Field(default_factory=ModerationPolicy)
    updated_at: datetime | None = None
    updated_by: str | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _rule_names_unique(self) -> Self:
        names = [rule.name for rule in self.rules]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"rule names must be unique: {', '.join(duplicates)}")
        return self

    def decisive(self) -> dict[str, Any]:
        """What the policy decides, without its bookkeeping fields."""
        return self.model_dump(mode="json", exclude=set(BOOKKEEPING_FIELDS))

    def content_hash(self) -> str:
        """Hash of what the policy decides: equal hashes decide every request alike."""
        return hashlib.sha256(json.dumps(self.decisive(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What the policy may look at for one request."""

    tenant: str
    requested: Mode | None = None
    tags: tuple[str, ...] = ()
    priority: int = 0
    requested_format: VerdictFormat | None = None


@dataclass(frozen=True, slots=True)
class ThinkingDecision:
    """The mode used and the rule that chose it (``default``, ``caller``, ``rule:<name>``, ``load`` or
    ``escalated``); with ``escalate``, the caps are the fast ask's and ``escalation`` says what follows."""

    mode: Mode
    rule: str
    max_completion_tokens: int
    thinking_token_budget: int | None
    policy_version: int
    verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT
    escalation: EscalationPolicy | None = None  # set when mode is ``escalate``
    reask: ThinkingDecision | None = None  # the thinking-on re-ask of an escalation

    def engine_terms(self) -> dict[str, Any]:
        """What of the policy reaches the engine request this decision makes (escalate's fast ask is a
        thinking-off ask), hence all that a verdict made under it depends on in the policy."""
        return {
            "thinking": self.mode == "on",
            "max_completion_tokens": self.max_completion_tokens,  # per keyframe
            "thinking_token_budget": self.thinking_token_budget,  # set by decide() with thinking on only
            "verdict_format": self.verdict_format,
        }

    def terms_digest(self) -> str:
        """:meth:`engine_terms` in a canonical serialisation, hashed: what verdicts are reused under, in
        place of the version number (which restarts at 1 when the policy's Redis key is lost)."""
        return _terms_digest(tuple(sorted(self.engine_terms().items())))


@lru_cache(maxsize=256)
def _terms_digest(terms: tuple[tuple[str, Any], ...]) -> str:
    """The digest of a decision's engine terms, once per set of terms (every request asks; a policy
    makes a few)."""
    canonical = json.dumps(dict(terms), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def reask_decision(
    policy: ThinkingPolicy, verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT
) -> ThinkingDecision:
    """The thinking-on decision an escalated frame is asked again under (in the fast ask's format)."""
    return ThinkingDecision(
        mode="on",
        rule="escalated",
        max_completion_tokens=policy.max_completion_tokens_on,
        thinking_token_budget=policy.thinking_token_budget,
        policy_version=policy.version,
        verdict_format=verdict_format,
    )


def decide(policy: ThinkingPolicy, context: RequestContext, under_load: bool = False) -> ThinkingDecision:
    """Apply the policy to one request.

    Order: the load rule (unless the matching rule keeps its mode under load), then the caller's request
    where allowed, then the first matching rule's mode, then the default. The verdict format is the
    policy's, or the caller's where the caller may choose the mode.
    """
    rule = next((r for r in policy.rules if r.matches(context)), None)
    caller_may_choose = policy.allow_caller_choice if rule is None else rule.lets_caller_choose(
        policy.allow_caller_choice
    )
    mode: Mode
    if under_load and not (rule and rule.keep_under_load):
        mode, chosen_by = "off", "load"
    elif context.requested is not None and caller_may_choose:
        mode, chosen_by = context.requested, "caller"
    elif rule is not None and rule.mode is not None:
        mode, chosen_by = rule.mode, f"rule:{rule.name}"
    else:  # no rule, or one that only says who may choose: the default chose
        mode, chosen_by = policy.default_mode, "default"
    thinking = mode == "on"
    cap = policy.max_completion_tokens_on if thinking else policy.max_completion_tokens_off
    escalating = mode == "escalate"
    verdict_format = (
        context.requested_format
        if context.requested_format is not None and caller_may_choose
        else policy.verdict_format
    )
    return ThinkingDecision(
        mode=mode,
        rule=chosen_by,
        max_completion_tokens=cap,
        thinking_token_budget=policy.thinking_token_budget if thinking else None,
        policy_version=policy.version,
        verdict_format=verdict_format,
        escalation=policy.escalation if escalating else None,
        reask=reask_decision(policy, verdict_format) if escalating else None,
    )


class EscalationBudget:
    """One replica's record of escalate-mode frames, and the caps of :class:`EscalationPolicy` on it.

    Per replica on purpose, like :class:`QueueLoad`: each replica spends its own engine slots.
    """

    def __init__(self, queue_depth: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self._queue_depth = queue_depth
        self._clock = clock
        self._frames: deque[tuple[float, bool]] = deque(maxlen=100_000)  # (when, escalated)

    def _trim(self, horizon_s: float) -> None:
        horizon = self._clock() - horizon_s
        while self._frames and self._frames[0][0] < horizon:
            self._frames.popleft()

    def share(self, window_s: float) -> float | None:
        """Escalations over escalate-mode frames in the last ``window_s`` seconds (None: no frame)."""
        self._trim(max(window_s, 60.0))
        horizon = self._clock() - window_s
        recent = [escalated for when, escalated in self._frames if when >= horizon]
        return sum(recent) / len(recent) if recent else None

    def skip_reason(self, rule: EscalationPolicy) -> Literal["cap_share", "cap_rate"] | None:
        """Why an unsure frame may not escalate now (None: it may). Call :meth:`record` either way."""
        if rule.cap_applies == "under_load" and self._queue_depth() == 0:
            return None
        self._trim(max(rule.window_s, 60.0))
        now = self._clock()
        if rule.max_per_minute is not None:
            last_minute = sum(escalated for when, escalated in self._frames if when >= now - 60.0)
            if last_minute + 1 > rule.max_per_minute:
                return "cap_rate"
        if rule.max_share is not None:
            window = [escalated for when, escalated in self._frames if when >= now - rule.window_s]
            if (sum(window) + 1) / (len(window) + 1) > rule.max_share:
                return "cap_share"
        return None

    def record(self, escalated: bool) -> None:
        """One escalate-mode frame judged, escalated or not."""
        self._frames.append((self._clock(), escalated))


class QueueLoad:
    """One replica's queue signals and the load rule's hysteresis state.

    Per replica on purpose: each replica admits to its own engine slots, so its own queue is what says
    whether it should shed reasoning.
    """

    def __init__(self, queue_depth: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self._queue_depth = queue_depth
        self._clock = clock
        self._waits: deque[tuple[float, float]] = deque(maxlen=4096)  # (when, seconds waited)
        self.shedding = False

    def observe_queue_wait(self, seconds: float) -> None:
        """Record how long one request waited for an engine slot."""
        self._waits.append((self._clock(), seconds))

    def queue_wait_ms(self, window_s: float) -> float:
        """Mean wait for a slot over the last ``window_s`` seconds (0 when nobody was admitted)."""
        horizon = self._clock() - window_s
        while self._waits and self._waits[0][0] < horizon:
            self._waits.popleft()
        if not self._waits:
            return 0.0
        return 1000 * sum(seconds for _, seconds in self._waits) / len(self._waits)

    def update(self, rule: LoadRule) -> bool:
        """Whether the load rule turns thinking off now (and remember it for the hysteresis)."""
        if not rule.enabled:
            self.shedding = False
            return False
        depth = self._queue_depth()
        wait_ms = self.queue_wait_ms(rule.window_s)
        signals = [
            (float(depth), rule.queue_depth_high, rule.queue_depth_low),
            (wait_ms, rule.queue_wait_ms_high, rule.queue_wait_ms_low),
        ]
        configured = [(value, high, low) for value, high, low in signals
                      if high is not None and low is not None]
        if not self.shedding and any(value > high for value, high, _ in configured):
            self.shedding = True
            log.warning("load rule: thinking OFF (queue depth %d, mean queue wait %.0f ms)", depth, wait_ms)
        elif self.shedding and all(value <= low for value, _, low in configured):
            self.shedding = False
            log.warning("load rule: thinking back to policy (queue depth %d, mean queue wait %.0f ms)",
                        depth, wait_ms)
        return self.shedding


def policy_changes(old: ThinkingPolicy, new: ThinkingPolicy) -> dict[str, dict[str, Any]]:
    """What differs between two documents, by dotted path: ``{"default_mode": {"old": "on", "new": "off"}}``.

    Lists (the rules) compare whole: a rule list is read in order, so any change to it is one change.
    """
    changes: dict[str, dict[str, Any]] = {}

    def walk(prefix: str, before: Any, after: Any) -> None:
        if isinstance(before, dict) and isinstance(after, dict):
            for key in sorted(set(before) | set(after)):
                walk(f"{prefix}.{key}" if prefix else key, before.get(key), after.get(key))
        elif before != after:
            changes[prefix] = {"old": before, "new": after}

    walk("", old.decisive(), new.decisive())
    return changes


class AuditEntry(BaseModel):
    """One change of the policy: who, when, why, from which version to which, and what changed."""

    at: datetime
    actor: str
    action: Literal["set", "rollback", "seed"]
    reason: str
    old_version: int | None
    new_version: int
    old_hash: str | None
    new_hash: str
    changes: dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class PolicyUpdate:
    """What a flip or rollback left in force, and whether it changed anything."""

    policy: ThinkingPolicy
    changed: bool  # False: the policy in force already decided alike (no new version, nothing audited)


class StoreStatus(BaseModel):
    """Where this replica's policy comes from and whether a flip can be made now."""

    backend: Literal["memory", "redis"]
    available: bool  # flips are refused (503) while False; serving goes on with the last known policy
    last_sync_at: datetime | None = None  # when this replica last read the shared document
    detail: str | None = None


@runtime_checkable  # the app's handlers take it as a dependency, which Litestar checks by isinstance
class PolicyStore(Protocol):
    """Where the policy lives: memory by default, Redis when configured (see gateway.policy.store)."""

    def current(self) -> ThinkingPolicy:
        """The policy in force on this replica (never waits on the network)."""
        ...

    def status(self) -> StoreStatus:
        """Backend, availability and last sync."""
        ...

    async def replace(
        self, policy: ThinkingPolicy, actor: str, reason: str, expected_version: int | None = None
    ) -> PolicyUpdate:
        """Install a new document under the next version (409 when ``expected_version`` is stale)."""
        ...

    async def amend(
        self, edit: Callable[[ThinkingPolicy], ThinkingPolicy], actor: str, reason: str,
        expected_version: int | None = None,
    ) -> PolicyUpdate:
        """Install ``edit(document in force)`` under the next version (one part of it changed)."""
        ...

    async def rollback(self, to_version: int | None, actor: str, reason: str) -> PolicyUpdate:
        """Install an earlier version's content under the next version (default: the one before now)."""
        ...

    async def history(self, limit: int) -> list[ThinkingPolicy]:
        """Earlier documents, newest first."""
        ...

    async def audit(self, limit: int) -> list[AuditEntry]:
        """The audit trail, newest first."""
        ...

    async def start(self) -> None:
        """Load the shared document and start following changes."""
        ...

    async def stop(self) -> None:
        """Stop following changes and close connections."""
        ...
