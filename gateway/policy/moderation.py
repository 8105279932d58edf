"""The moderation policy: what each tenant enforces, how sure a verdict must be, what engine failure answers.

It sits in the policy document beside the thinking policy (``ThinkingPolicy.moderation``), so it is stored,
versioned, audited and propagated to every replica exactly as a thinking flip is: one store, one history,
one version counter. Operators edit it through ``GET|PUT /admin/moderation-policy`` (docs/tenants.md).

Applied to a verdict after the engine (and any escalation) answered, by :func:`apply_moderation_policy`:
- a block naming only categories the tenant does not enforce becomes ``allow``; enforced ones stay named;
- a blocked category whose score is under its ``block`` threshold becomes ``review`` down to its
  ``review_from``, and below that the category is dropped (no enforced category left: ``allow``);
- a block or allow whose confidence is under ``review_below`` becomes ``review`` (under the thinking mode
  ``escalate`` it is first re-asked with thinking on: the escalation threshold is raised to it).
A verdict without a confidence (an engine that gave no logprobs) is left as the model said: there is
nothing to compare against a threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shaping.verdict import MODEL_CATEGORIES, KeyframeVerdict

EngineFailure = Literal["fail_closed", "review"]
# Why the policy changed the model's verdict (``modgate.moderation_rule``); None: it kept it.
PolicyRule = Literal["category_not_enforced", "below_block_threshold", "below_review_band", "review_below"]


class CategoryThreshold(BaseModel):
    """One category's marks on its score: block at ``block`` or above, review from ``review_from``."""

    model_config = ConfigDict(extra="forbid")

    block: float = Field(ge=0, le=1)
    review_from: float = Field(default=0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _band_under_threshold(self) -> Self:
        if self.review_from > self.block:
            raise ValueError(f"review_from ({self.review_from:g}) is above the block threshold "
                             f"({self.block:g})")
        return self


class ModerationEntry(BaseModel):
    """One tenant's policy (or the default); a field left out (null) comes from ``default``."""

    model_config = ConfigDict(extra="forbid")

    categories: list[str] | None = Field(default=None, max_length=len(MODEL_CATEGORIES))  # enforced ones
    review_below: float | None = Field(default=None, ge=0, le=1)
    thresholds: dict[str, CategoryThreshold] | None = None  # by category; a category not listed: no mark
    on_engine_failure: EngineFailure | None = None
    audit_sample_rate: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _known_categories(self) -> Self:
        named = (("categories", self.categories or []), ("thresholds", list(self.thresholds or {})))
        for field, names in named:
            unknown = sorted(set(names) - set(MODEL_CATEGORIES))
            if unknown:
                raise ValueError(f"{field}: unknown category {', '.join(unknown)} "
                                 f"(the model names {', '.join(MODEL_CATEGORIES)})")
        return self


def _complete_default() -> ModerationEntry:
    return ModerationEntry(categories=list(MODEL_CATEGORIES), review_below=0.0, thresholds={},
                           on_engine_failure="fail_closed", audit_sample_rate=0.0)


V = TypeVar("V")


def first(*values: V | None) -> V:
    """The first value that is set."""
    return next(value for value in values if value is not None)


@dataclass(frozen=True, slots=True)
class TenantModeration:
    """A tenant's entry with every field filled in (its own, else the default's)."""

    categories: frozenset[str]
    review_below: float
    thresholds: dict[str, CategoryThreshold]
    on_engine_failure: EngineFailure
    audit_sample_rate: float


class ModerationPolicy(BaseModel):
    """``{"default": {...}, "tenants": {"<tenant>": {...}}}``: the default enforces every category, keeps
    every verdict as the model gave it and fails closed."""

    model_config = ConfigDict(extra="forbid")

    default: ModerationEntry = Field(default_factory=_complete_default)
    tenants: dict[str, ModerationEntry] = Field(default_factory=dict, max_length=10_000)

    def for_tenant(self, tenant: str) -> TenantModeration:
        """The tenant's entry, each field it leaves out taken from the default (then the built-in one)."""
        own, default, built_in = self.tenants.get(tenant, ModerationEntry()), self.default, _BUILT_IN
        return TenantModeration(
            categories=frozenset(first(own.categories, default.categories, built_in.categories)),
            review_below=first(own.review_below, default.review_below, built_in.review_below),
            thresholds=first(own.thresholds, default.thresholds, built_in.thresholds),
            on_engine_failure=first(own.on_engine_failure, default.on_engine_failure,
                                    built_in.on_engine_failure),
            audit_sample_rate=first(own.audit_sample_rate, default.audit_sample_rate,
                                    built_in.audit_sample_rate),
        )


_BUILT_IN = _complete_default()


def apply_moderation_policy(
    verdict: KeyframeVerdict, policy: TenantModeration
) -> tuple[KeyframeVerdict, PolicyRule | None]:
    """The verdict the tenant's policy gives for the model's ``verdict``, and the rule that changed it."""
    rule: PolicyRule | None = None
    if verdict.action == "block":
        enforced = [c for c in verdict.categories if c in policy.categories]
        if verdict.categories and not enforced:
            return replace(verdict, action="allow", categories=()), "category_not_enforced"
        if len(enforced) < len(verdict.categories):
            rule = "category_not_enforced"
        scores = dict(verdict.category_scores or ())
        blocked: list[str] = []
        reviewed: list[str] = []
        for category in enforced:
            mark = policy.thresholds.get(category)
            score = scores.get(category, verdict.confidence)
            if mark is None or score is None or score >= mark.block:
                blocked.append(category)
            elif score >= mark.review_from:
                reviewed.append(category)
        if blocked:
            verdict = replace(verdict, categories=tuple(blocked))
        elif reviewed:
            return replace(verdict, action="review", categories=tuple(reviewed)), "below_block_threshold"
        elif enforced:
            return replace(verdict, action="allow", categories=()), "below_review_band"
    if (verdict.action != "review" and verdict.confidence is not None
            and verdict.confidence < policy.review_below):
        return replace(verdict, action="review"), "review_below"
    return verdict, rule
