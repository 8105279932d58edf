"""The simulated engine's side of ``POST /v1/decisions``: a question's answer distribution a test can set.

A decision request is told by its system prompt (shaping.decisions.SYSTEM_PROMPT). Its question is the
first text of the last user message; ``POST /sim/decisions`` sets the distribution over that question's
answers (``{"question": text, "answers": {"yes": 0.7, "no": 0.3}}``), and a question nobody set gets a
fixed one drawn from its text. At a place (after the assistant's start, ``continue_final_message``) the
engine lists, as vLLM under the grammar's mask, the next piece of each answer whose own tokenization (the
simulator's BPE, so answers that share a first piece collide as on the real tokenizer) passes through the
answer so far, with its share of those answers' mass; an answer that ends there lists the stop token.
The prompt goes through the simulated engine like any other, so the prefix cache and usage are the
engine's.
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Any

from litestar import post
from litestar.datastructures import State
from litestar.params import JSONBody
from pydantic import BaseModel, ConfigDict, Field

from deploy.simulator.answers import END_OF_OUTPUT, THINK_END
from deploy.simulator.protocol import ChatRequest, EngineError, user_parts
from deploy.simulator.scheduler import TokenEvent
from deploy.simulator.tokenizer import Token, render_chat
from shaping.decisions import SYSTEM_PROMPT


class DecisionAnswers(BaseModel):
    """Body of ``POST /sim/decisions``: the distribution of one question's answers (normalised here)."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    answers: dict[str, float]


def is_decision(request: ChatRequest) -> bool:
    """Whether a chat request is a decision place (its system prompt is the decisions')."""
    first = request.messages[0] if request.messages else {}
    return first.get("role") == "system" and first.get("content") == SYSTEM_PROMPT


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    for part in content or ():
        if isinstance(part, dict) and part.get("type") == "text":
            return str(part.get("text", ""))
    return ""


def _rests(regex: str) -> list[str]:
    """The answers' rests in ``(?:a|b|…)`` (``?`` after it: the answer may end here too) as the gateway
    writes them (metacharacters escaped)."""
    optional = regex.endswith(")?")
    inner = regex.removeprefix("(?:").removesuffix("?").removesuffix(")")
    rests = [re.sub(r"\\(.)", r"\1", rest) for rest in re.split(r"(?<!\\)\|", inner)]
    return [*rests, ""] if optional else rests


def decision_prompt(
    request: ChatRequest, bpe: Any, grid: Any
) -> tuple[list[Token], list[Any], str, str, bool]:
    """The prompt's tokens, its images, the question's text, the answer so far (after a thought the
    assistant's start carries) and whether the model thinks first, rendered as vLLM would with
    ``continue_final_message`` (the last message left open) or with the generation prompt."""
    extra = request.model_extra or {}
    continued = bool(extra.get("continue_final_message"))
    thinks = bool((request.chat_template_kwargs or {}).get("enable_thinking", True)) and not continued
    messages, images = [], []
    for message in request.messages:
        parts, found = user_parts(message.get("content", ""), grid)
        messages.append((str(message.get("role")), parts))
        images += found
    before = ""
    if continued and messages[-1][0] == "assistant":
        before = _text(request.messages[-1])
        tokens = render_chat(messages[:-1], False, True, bpe=bpe) + bpe.encode(before)
        before = before.rpartition(THINK_END)[2].lstrip("\n") if THINK_END in before else before
        question = _text(request.messages[-2])
    elif continued:  # a primer: the prompt ends inside the last message
        closed = render_chat(messages, False, False, bpe=bpe)
        end = bpe.encode("<|im_end|>\n")
        tokens = closed[: len(closed) - len(end)]
        question = _text(request.messages[-1])
    else:
        tokens = render_chat(messages, thinks, True, bpe=bpe)
        question = _text(request.messages[-1])
    return tokens, images, question, before, thinks


def place_output(
    set_answers: dict[str, dict[str, float]], question: str, regex: str | None, before: str, bpe: Any,
    thought: int = 0,
) -> list[TokenEvent]:
    """The token a place generates, listing every admitted first piece with its probability; with a
    ``thought`` (its tokens: thinking on), the thought first and the chosen answer written to its end."""
    if regex is None:  # a primer: any one token
        return [TokenEvent("content", END_OF_OUTPUT)]
    rests = _rests(regex)
    chosen = set_answers.get(question, {})
    weights = {}
    for rest in rests:
        label = before + rest
        weight = chosen.get(label)
        if weight is None:  # unset: a fixed draw from the question and the answer
            weight = 0.5 + (zlib.crc32(f"{question}\x1f{label}".encode()) % 1000) / 1000
        weights[rest] = max(0.0, weight)
    total = sum(weights.values())
    if total <= 0:
        raise EngineError(400, "no admitted answer has weight", "structured_outputs")
    mass: dict[str, float] = {}
    for rest, weight in weights.items():
        pieces = bpe.pieces(before + rest)  # the answer as the model writes it: its own tokenization
        written, index = "", 0
        while written != before and index < len(pieces) and before.startswith(written + pieces[index]):
            written, index = written + pieces[index], index + 1
        if written != before:  # a path the model's tokenization never takes: no mass there
            continue
        piece = pieces[index] if index < len(pieces) else END_OF_OUTPUT
        mass[piece] = mass.get(piece, 0.0) + weight
    reached = sum(mass.values())
    if reached <= 0:
        raise EngineError(400, f"no answer's tokens pass through {before!r}", "messages")
    mass = {piece: weight / reached for piece, weight in mass.items()}
    listed = sorted(mass.items(), key=lambda item: -item[1])
    alternatives = tuple((piece, math.log(p) if p > 0 else -9999.0) for piece, p in listed)
    token, logprob = alternatives[0]
    place = TokenEvent("content", token, logprob, alternatives)
    if not thought:
        return [place]
    words = [TokenEvent("reasoning", ("看", "图", "，", "判断", "。")[i % 5]) for i in range(thought)]
    # the answer written on: the likeliest answer whose own tokens start with the chosen piece
    starting = [rest for rest in weights if (bpe.pieces(rest) or [END_OF_OUTPUT])[0] == token]
    rest = max(starting, key=lambda r: weights[r]) if starting else ""
    after = [TokenEvent("content", piece) for piece in bpe.pieces(rest)[1:]]
    return [*words, TokenEvent("content", THINK_END), place, *after, TokenEvent("content", END_OF_OUTPUT)]


@post("/sim/decisions", status_code=200)
async def set_decision_answers(data: JSONBody[DecisionAnswers], state: State) -> dict[str, Any]:
    """Set the distribution of one question's answers (by its text)."""
    answers: dict[str, dict[str, float]] = state.sim.decision_answers
    answers[data.question] = dict(data.answers)
    return {"questions": len(answers)}
