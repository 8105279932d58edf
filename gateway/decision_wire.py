"""Wire models of ``POST /v1/decisions``: OpenAI's Decisions request and answer, as ``openai.types.Decision``
and ``decision_create_params`` spell them (field names, order, literal types), plus one fenced project field
on a refusal that says why no distribution was read.

Input items other than messages (function and custom tool calls and their outputs) are not taken: a 400
names the item (docs/decisions-api.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

MAX_QUESTIONS = 400
MAX_CHOICES = 255
MAX_LEVELS = 10  # a level's answer is one digit (docs/decisions-api.md)


class _Closed(BaseModel):
    """JSON's own types, unknown fields refused: what the OpenAPI document says is what is taken."""

    model_config = ConfigDict(strict=True, extra="forbid")


class PromptCacheBreakpoint(_Closed):
    """Marks the exact end of a reusable prompt prefix."""

    mode: Literal["explicit"]


class InputText(_Closed):
    """A text part."""

    text: str
    type: Literal["input_text"]
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None


class InputImage(_Closed):
    """An image part: a base64 data URL, or an https URL where remote images are enabled."""

    image_url: str = Field(min_length=1)
    type: Literal["input_image"]
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None


class InputJSON(_Closed):
    """A JSON object or an array of objects, rendered as compact JSON text."""

    data: dict[str, Any] | list[dict[str, Any]]
    type: Literal["input_json"]


InputPart = Annotated[InputText | InputImage | InputJSON, Field(discriminator="type")]


class OutputText(_Closed):
    """An assistant's earlier text."""

    text: str
    type: Literal["output_text"]


class OutputRefusal(_Closed):
    """An assistant's earlier refusal."""

    refusal: str
    type: Literal["refusal"]


AssistantPart = Annotated[OutputText | OutputRefusal, Field(discriminator="type")]


class UserMessage(_Closed):
    """A user message: text, images and JSON."""

    content: str | list[InputPart]
    role: Literal["user"]
    type: Literal["message"] = "message"


class InstructionMessage(_Closed):
    """A developer or system message: text only."""

    content: str | list[InputText]
    role: Literal["developer", "system"]
    type: Literal["message"] = "message"


class AssistantMessage(_Closed):
    """An assistant message: its earlier text or refusals."""

    content: str | list[AssistantPart]
    role: Literal["assistant"]
    phase: Literal["commentary", "final_answer"] | None = None
    type: Literal["message"] = "message"


Message = Annotated[UserMessage | InstructionMessage | AssistantMessage, Field(discriminator="role")]

QuestionPart = Annotated[InputText | InputImage | InputJSON, Field(discriminator="type")]
Instructions = str | list[QuestionPart]


class PredicateQuestion(_Closed):
    """How likely a statement about the input is true."""

    instructions: Instructions
    type: Literal["predicate"]
    name: str | None = None


class ChoiceOption(_Closed):
    """One option of a choice: typed (the string ``"true"`` and the boolean ``true`` are two options)."""

    value: StrictStr | StrictBool
    description: str | None = None


class ChoiceQuestion(_Closed):
    """Choose one of the supplied options."""

    choices: list[ChoiceOption] = Field(min_length=2, max_length=MAX_CHOICES)
    instructions: Instructions
    type: Literal["choice"]
    name: str | None = None

    @field_validator("choices")
    @classmethod
    def _unique(cls, choices: list[ChoiceOption]) -> list[ChoiceOption]:
        seen: set[tuple[type, str | bool]] = set()
        for option in choices:
            key = (type(option.value), option.value)
            if key in seen:
                raise ValueError(f"the choice value {option.value!r} is given twice: each must be unique")
            seen.add(key)
        return choices


class ScoreLevel(_Closed):
    """One level of a score, lowest first."""

    label: str
    description: str | None = None


class ScoreQuestion(_Closed):
    """Rate the input on ordered levels (indexed from 0)."""

    instructions: Instructions
    levels: list[ScoreLevel] = Field(min_length=2, max_length=MAX_LEVELS)
    type: Literal["score"]
    name: str | None = None


Question = Annotated[PredicateQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class PromptCacheOptions(_Closed):
    """Prompt caching (the engine's prefix cache serves every request: accepted, nothing to switch)."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] = "30m"


class DecisionRequest(_Closed):
    """``POST /v1/decisions``."""

    input: str | list[Message]
    model: str
    questions: list[Question] = Field(min_length=1, max_length=MAX_QUESTIONS)
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = None


# --- the answer -------------------------------------------------------------------------------------------


class PredicateAnswer(BaseModel):
    """P(the statement is true)."""

    name: str | None = None
    probability: float
    type: Literal["predicate"] = "predicate"


class ChoiceProbability(BaseModel):
    """One option's probability."""

    probability: float
    value: StrictStr | StrictBool


class ChoiceAnswer(BaseModel):
    """The most probable option, its probability, and every option's."""

    choice: StrictStr | StrictBool
    confidence: float
    name: str | None = None
    probabilities: list[ChoiceProbability]
    type: Literal["choice"] = "choice"


class ScoreProbability(BaseModel):
    """One level's probability (``value``: its index, from 0)."""

    label: str
    probability: float
    value: int


class ScoreAnswer(BaseModel):
    """The expected level index, the most probable level's probability, and every level's."""

    confidence: float
    name: str | None = None
    probabilities: list[ScoreProbability]
    score: float
    type: Literal["score"] = "score"


class RefusalReason(BaseModel):
    """Why a question has no answer (project field): ``code`` is one of ``docs/decisions-api.md``'s."""

    code: Literal["no_distribution", "engine_rejected"]
    message: str


class RefusalAnswer(BaseModel):
    """No answer to this question; the others are answered."""

    name: str | None = None
    type: Literal["refusal"] = "refusal"
    # --- project field below (not in OpenAI's API) ---
    modgate: RefusalReason | None = None


Answer = Annotated[
    PredicateAnswer | ChoiceAnswer | ScoreAnswer | RefusalAnswer, Field(discriminator="type")
]


class InputTokensDetails(BaseModel):
    """What of the input the engine found in its prefix cache."""

    cache_write_tokens: int
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    """What of the output was reasoning."""

    reasoning_tokens: int


class DecisionUsage(BaseModel):
    """Token usage for the request, over every engine call it made."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Decision(BaseModel):
    """The answers, in question order."""

    answers: list[Answer]
    model: str
    usage: DecisionUsage
