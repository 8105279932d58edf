"""Wire models of the moderation API: OpenAI's moderation shapes, plus a fenced project field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.decisions import new_decision_id
from contracts.escalation_rule import EscalationReason
from gateway.policy.moderation import PolicyRule
from gateway.policy.rules import EngineMode, Mode
from shaping.verdict import Action, VerdictFormat


class ImageURL(BaseModel):
    """``{"url": "data:image/jpeg;base64,..."}``."""

    # strict: JSON's own types, as the OpenAPI document says; unknown fields ignored (OpenAI's "detail")
    model_config = ConfigDict(strict=True)

    url: str = Field(min_length=1)


class ImageURLPart(BaseModel):
    """An image input part."""

    model_config = ConfigDict(strict=True)

    type: Literal["image_url"]
    image_url: ImageURL


class TextPart(BaseModel):
    """A text input part."""

    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


InputPart = Annotated[ImageURLPart | TextPart, Field(discriminator="type")]


class RequestOptions(BaseModel):
    """Project-only request options (the ``openai`` client sends them with ``extra_body``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # honoured only where the thinking policy lets callers ask
    thinking: Mode | None = None
    video_id: str | None = Field(default=None, max_length=200)
    tags: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=16)
    priority: int = Field(default=0, ge=-10, le=10)
    # honoured where the thinking policy lets callers choose the mode, like ``thinking``
    verdict_format: VerdictFormat | None = None


class ModerationRequest(BaseModel):
    """``POST /v1/moderations``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: str | list[str] | list[InputPart]
    model: str | None = None
    # --- project fields below (not in OpenAI's API) ---
    modgate: RequestOptions | None = None


class EscalatedFrom(BaseModel):
    """The fast (thinking-off) verdict an escalated answer replaced, and why it was asked again."""

    action: Action
    categories: list[str]
    confidence: float | None
    why: EscalationReason
    threshold: float  # the policy's confidence threshold at the time
    request_id: str  # the fast engine request


class ModerationDetails(BaseModel):
    """What modgate adds to each result: how the verdict was made."""

    action: Action
    reason: str | None = None  # set when the model's output could not be used as it was
    # P(action) as the engine's logprobs give it (its listed spellings, never renormalised); null when the
    # engine gave none, and then ``confidence_reason`` says why (never a number the model wrote)
    confidence: float | None = None
    confidence_reason: str | None = None
    verdict_format: VerdictFormat = "compact"  # what the model was asked to write
    thinking: EngineMode
    thinking_rule: str
    policy_version: int
    latency_ms: float
    queue_ms: float
    shaping_ms: float
    ttft_ms: float | None
    decode_ms: float | None = None  # engine time after the first token
    prompt_tokens: int
    cached_tokens: int
    image_tokens: int | None  # null when the engine counts none: then ``image_tokens_reason`` says so
    image_tokens_reason: str | None = None
    completion_tokens: int
    reasoning_tokens: int
    frame_sha256: str | None
    reused: Literal["exact", "near", None] = None
    request_id: str  # the engine request that made the verdict (shared by a packed request's frames)
    # this verdict's own id, in the decision log, on its review item and on a label of it (docs/decisions.md)
    decision_id: str = Field(default_factory=new_decision_id)
    # escalate mode: the fast verdict a thinking-on answer replaced, or why an unsure one was not re-asked
    thinking_mode: Mode | None = None  # the mode the policy chose for the frame
    escalated_from: EscalatedFrom | None = None
    escalation_skipped: Literal["cap_share", "cap_rate", "reask_failed"] | None = None
    # what produced the verdict: the engine's model (and revision where known), the system prompt's version,
    # the version of the policy document holding the moderation policy (docs/decisions.md)
    model: str | None = None  # null only when no engine has answered /v1/models yet
    model_revision: str | None = None
    prompt_version: str | None = None
    prompt_sha256: str | None = None  # the prompt as sent (a version's text may carry engine-fitted guidance)
    moderation_policy_version: int | None = None
    # the tenant's moderation policy (docs/tenants.md): the model's action where the policy changed it; why
    categories: list[str] = Field(default_factory=list)  # what the verdict names (a review's too)
    model_action: Action | None = None
    moderation_rule: PolicyRule | None = None
    engine_failure: str | None = None  # the engine could not answer and the tenant's policy says ``review``


class ModerationResult(BaseModel):
    """One result per image; for text only, one per string of a list of strings, else one."""

    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
    category_applied_input_types: dict[str, list[Literal["text", "image"]]]
    # --- project field below (not in OpenAI's API) ---
    modgate: ModerationDetails


class ModerationResponse(BaseModel):
    """The moderation answer."""

    id: str
    model: str
    results: list[ModerationResult]


class OpenAIErrorDetail(BaseModel):
    """What went wrong, as OpenAI's API says it."""

    message: str
    type: str  # invalid_request_error, authentication_error, permission_error, rate_limit_error, server_error
    param: str | None
    code: str | None


class OpenAIErrorResponse(BaseModel):
    """Every error the gateway answers: ``{"error": {"message", "type", "param", "code"}}``."""

    error: OpenAIErrorDetail
