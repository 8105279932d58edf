"""What the simulated model answers: the verdict text in the form the grammar allows, and its tokens.

Frames are judged by their ground truth (``deploy.simulator.truth``), a text-only request by its words. At
each verdict's action and categories the answer's tokens carry the alternatives the model weighed, so
logprobs read as a real model's would. They come from the simulator's own confidence model only (the
chosen action at its confidence, the rest shared by a fixed rule): never from the other thinking mode's
answer, which would leak ground truth into the fast verdict's log-probabilities.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from deploy.simulator.engine import TokenEvent
from deploy.simulator.protocol import ChatRequest, EngineError
from deploy.simulator.truth import FrameTruth, SimVerdict
from shaping.bpe import QwenBPE
from shaping.verdict import ACTIONS, MODEL_CATEGORIES, compact_text

END_OF_OUTPUT = "<|im_end|>"  # the stop token: generated (one decode step), counted, never in the text
THINK_END = "</think>"
MASKED_LOGPROB = -9999.0  # what vLLM writes for a token the grammar masked (-inf, clamped)

# A text-only request (no image) is judged by words: ground truth for text as marker squares are for frames.
TEXT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "violence": ("kill", "stab", "shoot", "gun", "knife", "attack", "杀", "枪", "砍"),
    "violence/graphic": ("blood", "gore", "corpse", "血", "尸体"),
    "sexual": ("nude", "porn", "explicit sex", "色情", "裸"),
    "self-harm": ("suicide", "self-harm", "cut myself", "自杀", "自残"),
    "hate": ("hate speech", "slur", "仇恨"),
    "harassment": ("harass", "bully", "humiliate", "霸凌"),
    "illicit": ("cocaine", "heroin", "meth", "counterfeit", "毒品", "赌博"),
}


def text_verdict(text: str) -> dict[str, Any]:
    """The verdict on a text-only request: block with the categories its words name, else allow."""
    lowered = text.lower()
    named = [category for category, words in TEXT_KEYWORDS.items() if any(w in lowered for w in words)]
    if named:
        return {"verdict": "block", "categories": named, "confidence": 0.9}
    return {"verdict": "allow", "categories": [], "confidence": 0.9}


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user turn (its text parts joined): what a text-only request asks about."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [part for part in content if isinstance(part, dict) and part.get("type") == "text"]
            return "\n".join(str(part.get("text", "")) for part in texts)
    return ""


def answer_text(
    request: ChatRequest,
    truths: list[FrameTruth],
    enable_thinking: bool,
    allows: Callable[[str], object] | None = None,
) -> tuple[str, list[float]]:
    """The answer text in the form the request's grammar allows, and each verdict's confidence.

    ``allows``: whether a text is one the engine's grammar admits (truthy: llama.cpp's GBNF ``grammar``),
    tried as vLLM's ``structured_outputs.regex`` is.
    """
    verdicts = [t.verdict(enable_thinking) for t in truths]
    confidences = [t.confidence(enable_thinking) for t in truths]
    if not truths:  # a text-only request: the words decide (text_verdict)
        said = text_verdict(last_user_text(request.messages))
        verdicts = [SimVerdict(said["verdict"], tuple(said["categories"]))]
        confidences = [said["confidence"]]
    objects = [
        {"verdict": v.action, "categories": list(v.categories), "confidence": round(c, 2)}
        for v, c in zip(verdicts, confidences, strict=True)
    ]
    compact = "\n".join(
        compact_text(v.action, v.categories)  # type: ignore[arg-type]  # the label's action: one of three
        for v in verdicts
    )
    one_json = json.dumps(objects[0], separators=(",", ":"), ensure_ascii=False)
    structured = request.structured_outputs or {}
    if allows is None and isinstance(structured.get("regex"), str):
        try:
            allows = re.compile(structured["regex"]).fullmatch
        except re.error as exc:
            message = f"invalid regex in structured_outputs: {exc}"
            raise EngineError(400, message, "structured_outputs") from exc
    if allows is not None:
        for text in (compact, one_json):
            if allows(text):
                return text, confidences
        message = "the simulator cannot write a verdict this grammar allows"
        raise EngineError(400, message, "structured_outputs")
    if "choice" in structured:
        choices = [str(c) for c in structured["choice"]]
        wanted = compact if compact in choices else verdicts[0].action
        return (wanted if wanted in choices else choices[0]), confidences
    schema: dict[str, Any] = {}
    if request.response_format and request.response_format.get("type") == "json_schema":
        schema = request.response_format.get("json_schema", {}).get("schema", {})
    elif "json" in structured and isinstance(structured["json"], dict):
        schema = structured["json"]
    if "frames" in schema.get("properties", {}):
        return json.dumps({"frames": objects}, separators=(",", ":"), ensure_ascii=False), confidences
    return one_json, confidences


def _distribution(
    chosen: str, probability: float, others: list[str], weights: list[float]
) -> list[tuple[str, float]]:
    """``chosen`` at ``probability``, the rest shared by ``weights``; as (token, logprob), best first."""
    total = sum(weights) or 1.0
    rest = max(0.0, 1.0 - probability)
    pairs = [(chosen, probability)] + [(o, rest * w / total) for o, w in zip(others, weights, strict=True)]
    return sorted(
        ((token, math.log(p) if p > 0 else MASKED_LOGPROB) for token, p in pairs), key=lambda pair: -pair[1]
    )


# Where a simulated model's doubt goes, by the action it chose: a sure-looking allow or block doubts towards
# review first, a review splits its doubt evenly. A fixed rule of the chosen action, blind to ground truth.
_DOUBT: dict[str, tuple[tuple[str, float], ...]] = {
    "allow": (("review", 0.75), ("block", 0.25)),
    "block": (("review", 0.75), ("allow", 0.25)),
    "review": (("allow", 0.5), ("block", 0.5)),
}


def _action_alternatives(chosen: str, confidence: float) -> list[tuple[str, float]]:
    """The three actions at a verdict's first token: ``chosen`` at ``confidence``, the rest as ``_DOUBT``."""
    doubt = _DOUBT.get(chosen, tuple((a, 0.5) for a in ACTIONS if a != chosen))
    return _distribution(chosen, confidence, [a for a, _ in doubt], [w for _, w in doubt])


def _category_alternatives(bpe: QwenBPE, piece: str, lead: str, confidence: float) -> list[tuple[str, float]]:
    """At the token holding a category's first letter (``:self`` or ``viol``), the tokens the other
    categories would start with there (``lead`` is what the token writes before the name); the named one
    at ``(1 + confidence) / 2``."""
    others = []
    for category in MODEL_CATEGORIES:
        head = bpe.pieces(lead + category)[0] if lead else bpe.pieces(category)[0]
        if head != piece and head not in others:
            others.append(head)
    return _distribution(piece, (1 + confidence) / 2, others, [1.0] * len(others))


def _verdict_places(answer: str) -> tuple[dict[int, int], dict[int, int]]:
    """Character offsets of each verdict's action and of each category it names, mapped to the frame."""
    actions: dict[int, int] = {}
    categories: dict[int, int] = {}
    if answer.startswith("{"):
        for frame, found in enumerate(re.finditer(r'"verdict":"', answer)):
            actions[found.end()] = frame
            listed = re.compile(r'"categories":\[([^\]]*)\]').search(answer, found.end())
            if listed is not None:
                for item in re.finditer(r'"([^"]*)"', listed.group(1)):
                    categories[listed.start(1) + item.start(1)] = frame
        return actions, categories
    position = 0
    for frame, line in enumerate(answer.split("\n")):
        actions[position] = frame
        if line.startswith("block:"):
            offset = position + len("block:")
            for name in line[len("block:") :].split(","):
                categories[offset] = frame
                offset += len(name) + 1
        position += len(line) + 1
    return actions, categories


def answer_tokens(bpe: QwenBPE, answer: str, confidences: list[float]) -> list[TokenEvent]:
    """The answer in the model's tokens; at each verdict's action and categories (the token holding their
    first letter: BPE may merge a category's head with the colon), the alternatives the model weighed."""
    actions, categories = _verdict_places(answer)
    events: list[TokenEvent] = []
    position = 0
    for piece in bpe.pieces(answer):
        alternatives: list[tuple[str, float]] = [(piece, 0.0)]
        inside = range(position, position + len(piece))
        category = next((c for c in inside if c in categories), None)
        if position in actions and actions[position] < len(confidences):
            alternatives = _action_alternatives(piece, confidences[actions[position]])
        elif category is not None and categories[category] < len(confidences):
            lead = piece[: category - position]
            alternatives = _category_alternatives(bpe, piece, lead, confidences[categories[category]])
        logprob = dict(alternatives).get(piece, 0.0)
        events.append(TokenEvent("content", piece, logprob, tuple(alternatives)))
        position += len(piece)
    return events
