"""The verdict the model is asked for, its output constraint, and parsing that never crashes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from contracts.actions import ACTIONS as ACTIONS
from contracts.actions import Action as Action

VerdictFormat = Literal["compact", "json"]
VERDICT_FORMATS: tuple[VerdictFormat, ...] = ("compact", "json")
DEFAULT_VERDICT_FORMAT: VerdictFormat = "compact"

# The categories the model may name: a subset of OpenAI's moderation categories that a keyframe can show.
MODEL_CATEGORIES: tuple[str, ...] = (
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
    "self-harm",
    "hate",
    "harassment",
    "illicit",
)

# Every category of the OpenAI moderation response, in the order the wire has them.
OPENAI_CATEGORIES: tuple[str, ...] = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)

# The categories OpenAI judges an image for (its ``category_applied_input_types``); the rest are judged on
# text alone, so an image without a caption applies them to nothing.
IMAGE_CATEGORIES: frozenset[str] = frozenset(
    {"self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "violence", "violence/graphic"}
)

InputType = Literal["text", "image"]


def applied_input_types(image: bool, text: bool) -> dict[str, list[InputType]]:
    """Per OpenAI category, the input types it was applied to: the text (a text input or an image's caption)
    for every category, the image for :data:`IMAGE_CATEGORIES` only."""
    applied: dict[str, list[InputType]] = {}
    for category in OPENAI_CATEGORIES:
        kinds: list[InputType] = ["text"] if text else []
        if image and category in IMAGE_CATEGORIES:
            kinds.append("image")
        applied[category] = kinds
    return applied


VerdictProblem = Literal[
    "empty_output", "truncated_output", "invalid_json", "schema_mismatch", "invalid_compact"
]
COMPACT_SEPARATOR = "\n"  # between the verdicts of packed frames: one line per frame


def verdict_schema() -> dict[str, Any]:
    """JSON schema of one frame's verdict."""
    return {
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": list(ACTIONS)},
            "categories": {
                "type": "array",
                "items": {"type": "string", "enum": list(MODEL_CATEGORIES)},
                "maxItems": len(MODEL_CATEGORIES),
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["verdict", "categories", "confidence"],
        "additionalProperties": False,
    }


def packed_verdict_schema(frames: int) -> dict[str, Any]:
    """JSON schema of one verdict per frame, for K frames packed into one engine request."""
    return {
        "type": "object",
        "properties": {
            "frames": {"type": "array", "items": verdict_schema(), "minItems": frames, "maxItems": frames},
        },
        "required": ["frames"],
        "additionalProperties": False,
    }


def verdict_regex() -> str:
    """A whitespace-free regex for one verdict: the shortest output the engine can be held to."""
    category = "|".join(re.escape(c) for c in MODEL_CATEGORIES)
    item = f'"({category})"'
    return (
        r'\{"verdict":"(allow|review|block)","categories":\[(' + item + "(," + item + r")*)?\],"
        r'"confidence":(0(\.[0-9]{1,2})?|1(\.0)?)\}'
    )


def compact_regex(frames: int = 1) -> str:
    """The compact verdict: ``allow``, ``review`` or ``block:<category>[,<category>…]``, one line per frame.

    The three actions start with different letters, so the verdict's first token alone names the action
    whatever the tokenizer cuts it into: that is where the confidence is read (shaping.confidence).
    """
    # The names are spelled as they are: [a-z/-] only, nothing a regex needs escaped (a test holds it).
    category = "(" + "|".join(MODEL_CATEGORIES) + ")"
    one = f"(allow|review|block:{category}(,{category}){{0,{len(MODEL_CATEGORIES) - 1}}})"
    return one if frames == 1 else one + f"(\\n{one}){{{frames - 1}}}"


def compact_text(action: Action, categories: tuple[str, ...] | list[str] = ()) -> str:
    """One verdict in the compact form (what the grammar lets the engine write)."""
    if action != "block":
        return action
    if not categories:
        raise ValueError("a compact block names at least one category")
    return "block:" + ",".join(categories)


def structured_outputs(verdict_format: VerdictFormat, constraint: str, frames: int = 1) -> dict[str, Any]:
    """What holds the engine to the verdict form: ``structured_outputs`` or ``response_format``."""
    if verdict_format == "compact":
        return {"structured_outputs": {"regex": compact_regex(frames)}}
    if constraint == "regex" and frames == 1:
        return {"structured_outputs": {"regex": verdict_regex()}}
    return {"response_format": response_format(frames)}


def response_format(frames: int = 1) -> dict[str, Any]:
    """The OpenAI ``response_format`` that holds the engine to the verdict schema."""
    schema = verdict_schema() if frames == 1 else packed_verdict_schema(frames)
    return {
        "type": "json_schema",
        "json_schema": {"name": "keyframe_verdict", "schema": schema, "strict": True},
    }


@dataclass(frozen=True, slots=True)
class KeyframeVerdict:
    """One frame's verdict, as parsed from the model (or the fallback when it could not be)."""

    action: Action
    categories: tuple[str, ...] = ()
    # The probability of the action from the engine's logprobs (shaping.confidence), None when the engine
    # gave none; ``confidence_note`` says why. Never the number a JSON verdict writes: that is stated_*.
    confidence: float | None = None
    problem: VerdictProblem | None = None  # set when the output could not be used as it was
    detail: str = ""  # what was wrong, for logs and the answer's reason
    stated_confidence: float | None = None  # what a JSON verdict wrote in its "confidence" field
    category_scores: tuple[tuple[str, float], ...] | None = None  # from logprobs, where the engine gave them
    confidence_note: str | None = None  # why ``confidence`` is None (or how it was read)
    verdict_format: VerdictFormat | None = None  # the form the engine answered in

    @property
    def flagged(self) -> bool:
        """A frame is flagged unless the verdict allows it."""
        return self.action != "allow"


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """The engine's answer split into reasoning and verdicts."""

    verdicts: tuple[KeyframeVerdict, ...]
    reasoning: str | None = None
    raw_content: str = ""
    problems: tuple[VerdictProblem, ...] = field(default=())


def _review(problem: VerdictProblem, detail: str) -> KeyframeVerdict:
    return KeyframeVerdict(action="review", problem=problem, detail=detail)


_COMPACT_START = re.compile(r"(allow|review|block)(?![A-Za-z_])")
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def _strip_inline_reasoning(content: str) -> tuple[str, str | None]:
    """Reasoning that leaked into content (no reasoning parser on the engine) is split off."""
    reasoning_parts = [m.group(0)[7:-8] for m in _THINK_BLOCK.finditer(content)]
    content = _THINK_BLOCK.sub("", content)
    if "</think>" in content:  # an opening tag the template wrote, so only the closing one is in the output
        head, _, content = content.partition("</think>")
        reasoning_parts.append(head)
    reasoning = "".join(reasoning_parts).strip() or None
    return _FENCE.sub("", content.strip()).strip(), reasoning


def _verdict_from_obj(obj: object) -> KeyframeVerdict:
    if not isinstance(obj, dict):
        return _review("schema_mismatch", f"expected a JSON object, got {type(obj).__name__}")
    action = obj.get("verdict")
    if action not in ACTIONS:
        return _review("schema_mismatch", f"verdict {action!r} is not one of allow/review/block")
    raw_categories = obj.get("categories", [])
    if not isinstance(raw_categories, list) or not all(isinstance(c, str) for c in raw_categories):
        return _review("schema_mismatch", "categories is not a list of strings")
    unknown = [c for c in raw_categories if c not in MODEL_CATEGORIES]
    if unknown:
        return _review("schema_mismatch", f"unknown categories {unknown}")
    confidence = obj.get("confidence", 0.0)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        return _review("schema_mismatch", f"confidence {confidence!r} is not a number in [0, 1]")
    categories = tuple(dict.fromkeys(raw_categories))
    return KeyframeVerdict(
        action=action, categories=categories, stated_confidence=float(confidence), verdict_format="json"
    )


def parse_compact_verdict(text: str) -> KeyframeVerdict:
    """One compact verdict (``allow``, ``review``, ``block:violence,hate``); anything else is review."""
    text = text.strip()
    if text in ("allow", "review"):
        return KeyframeVerdict(action=text, verdict_format="compact")  # type: ignore[arg-type]  # mypy does not narrow by `in`
    head, colon, tail = text.partition(":")
    if head != "block" or not colon:
        return _review("invalid_compact", f"{text[:60]!r} is not allow, review or block:<categories>")
    names = [name.strip() for name in tail.split(",")]
    unknown = [name for name in names if name not in MODEL_CATEGORIES]
    if unknown or not names:
        return _review("invalid_compact", f"unknown categories {unknown}")
    return KeyframeVerdict(action="block", categories=tuple(dict.fromkeys(names)), verdict_format="compact")


def parse_engine_output(
    content: str | None,
    reasoning: str | None,
    finish_reason: str | None,
    frames: int = 1,
) -> ParsedOutput:
    """Turn one engine choice into ``frames`` verdicts; never raises on any output."""
    text, leaked = _strip_inline_reasoning(content or "")
    reasoning = reasoning or leaked

    def fallback(problem: VerdictProblem, detail: str) -> ParsedOutput:
        verdict = _review(problem, detail)
        return ParsedOutput((verdict,) * frames, reasoning, content or "", (problem,))

    if finish_reason == "length":
        return fallback(
            "truncated_output", "the engine stopped at max_completion_tokens before the verdict ended"
        )
    if not text:
        return fallback("empty_output", "the engine returned no answer after its reasoning")
    if _COMPACT_START.match(text):  # the compact form: one line per frame
        lines = [line for line in text.split(COMPACT_SEPARATOR) if line.strip()]
        if len(lines) != frames:
            return fallback("invalid_compact", f"expected {frames} verdict line(s), got {len(lines)}")
        verdicts = tuple(parse_compact_verdict(line) for line in lines)
        problems = tuple(v.problem for v in verdicts if v.problem)
        return ParsedOutput(verdicts, reasoning, content or "", problems)
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return fallback("invalid_json", f"the answer is not a compact verdict and not JSON: {exc}")
    if frames == 1:
        verdict = _verdict_from_obj(obj)
        problems = (verdict.problem,) if verdict.problem else ()
        return ParsedOutput((verdict,), reasoning, content or "", problems)
    items = obj.get("frames") if isinstance(obj, dict) else None
    if not isinstance(items, list) or len(items) != frames:
        return fallback("schema_mismatch", f"expected a 'frames' list of {frames} verdicts")
    verdicts = tuple(_verdict_from_obj(item) for item in items)
    return ParsedOutput(verdicts, reasoning, content or "", tuple(v.problem for v in verdicts if v.problem))
