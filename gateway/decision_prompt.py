"""A Decisions request as engine messages: the shared input once (images shaped to the token budget), and per
question its own closing message, so every question's prompt starts with the same input (the engine's prefix
cache computes it once).

Images go through the moderation path's shaping (a data URL, or an https URL under the remote-image rules);
one that cannot be used answers the image's own status as a moderated image does (413 too large, 415 a format
outside JPEG, PNG and WebP, 422 undecodable; 400 for a URL that is not taken), naming its part.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.decision_wire import (
    AssistantMessage,
    ChoiceQuestion,
    DecisionRequest,
    InputImage,
    InputJSON,
    InputText,
    OutputText,
    PredicateQuestion,
    Question,
    ScoreQuestion,
)
from gateway.errors import ClientError
from shaping.decisions import (
    PREDICATE_LABELS,
    SYSTEM_PROMPT,
    QuestionKind,
    option_labels,
    question_text,
    score_labels,
)
from shaping.image import ShapedImage

Shape = Callable[[str], Awaitable[ShapedImage]]
"""A data URL or remote URL to its shaped keyframe (the moderation service's ``shape``, for one tenant)."""


@dataclass(frozen=True, slots=True)
class AskedQuestion:
    """One question as the engine is asked it: its closing message and its admitted answers."""

    kind: QuestionKind
    name: str | None
    message: dict[str, Any]
    labels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SharedInput:
    """The request's input as engine messages (the system prompt first), and the messages up to its
    ``prompt_cache_breakpoint`` (the last one's content cut after the marked part), or None without one."""

    messages: list[dict[str, Any]]
    up_to_breakpoint: list[dict[str, Any]] | None
    images: int


async def _part(part: object, where: str, shape: Shape) -> dict[str, Any]:
    """One wire part as an engine content part."""
    if isinstance(part, InputText | OutputText):
        return {"type": "text", "text": part.text}
    if isinstance(part, InputJSON):
        return {"type": "text", "text": json.dumps(part.data, separators=(",", ":"), ensure_ascii=False)}
    if isinstance(part, InputImage):
        try:
            shaped = await shape(part.image_url)
        except ClientError as exc:  # the same error, naming the part
            exc.param = f"{where}.image_url"
            raise
        return {"type": "image_url", "image_url": {"url": shaped.data_url}, "uuid": shaped.sha256}
    refusal = getattr(part, "refusal", "")
    return {"type": "text", "text": str(refusal)}


async def shared_input(request: DecisionRequest, shape: Shape) -> SharedInput:
    """The input's messages after the system prompt, with the prefix a breakpoint marks."""
    system = {"role": "system", "content": SYSTEM_PROMPT}
    if isinstance(request.input, str):
        return SharedInput([system, {"role": "user", "content": request.input}], None, 0)
    messages: list[dict[str, Any]] = [system]
    cut: list[dict[str, Any]] | None = None
    images = 0
    for m, message in enumerate(request.input):
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
            continue
        parts = []
        for p, part in enumerate(message.content):
            parts.append(await _part(part, f"input[{m}].content[{p}]", shape))
            images += isinstance(part, InputImage)
            if getattr(part, "prompt_cache_breakpoint", None) is not None:
                cut = [*messages, {"role": message.role, "content": list(parts)}]
        role = "assistant" if isinstance(message, AssistantMessage) else message.role
        messages.append({"role": role, "content": parts})
    return SharedInput(messages, cut, images)


def _labels(question: Question) -> tuple[QuestionKind, tuple[str, ...], list[str | None]]:
    if isinstance(question, PredicateQuestion):
        return "predicate", PREDICATE_LABELS, []
    if isinstance(question, ChoiceQuestion):
        values = [option.value for option in question.choices]
        return "choice", option_labels(values), [option.description for option in question.choices]
    assert isinstance(question, ScoreQuestion)
    descriptions = [
        level.label if level.description is None else f"{level.label}: {level.description}"
        for level in question.levels
    ]
    return "score", score_labels(len(question.levels)), list(descriptions)


async def asked_questions(questions: Sequence[Question], shape: Shape) -> list[AskedQuestion]:
    """Each question's closing message: its instructions, then its admitted answers and what they mean."""
    asked = []
    for q, question in enumerate(questions):
        kind, labels, descriptions = _labels(question)
        instructions = question.instructions
        parts: list[dict[str, Any]] = (
            [{"type": "text", "text": instructions}]
            if isinstance(instructions, str)
            else [await _part(part, f"questions[{q}].instructions[{p}]", shape)
                  for p, part in enumerate(instructions)]
        )
        parts.append({"type": "text", "text": "\n" + question_text(kind, labels, descriptions)})
        asked.append(AskedQuestion(kind, question.name, {"role": "user", "content": parts}, labels))
    return asked


@dataclass(frozen=True, slots=True)
class Thinking:
    """Whether the model thinks before it answers, with the policy's caps on the thought."""

    on: bool = False
    max_completion_tokens: int = 0  # the thought and the answer
    thinking_token_budget: int | None = None


def question_body(
    shared: SharedInput, question: AskedQuestion, *, model: str, priority: int | None,
    thinking: Thinking = Thinking(),
) -> dict[str, Any]:
    """The chat request of one question: the shared input, then the question, thinking as the policy says."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [*shared.messages, question.message],
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": thinking.on},
    }
    if thinking.on:
        body["max_completion_tokens"] = thinking.max_completion_tokens
        if thinking.thinking_token_budget is not None:
            body["thinking_token_budget"] = thinking.thinking_token_budget
    if priority is not None:
        body["priority"] = priority
    return body


def primer_body(shared: SharedInput, *, model: str) -> dict[str, Any]:
    """The chat request whose prompt ends where the shared input does (at its breakpoint, if marked)."""
    return {
        "model": model,
        "messages": shared.up_to_breakpoint or shared.messages,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
