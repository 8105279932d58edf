"""What an engine answered: a whole answer with its timings, and an error answer as the gateway's error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from gateway.engine.usage import Usage
from gateway.engine.wires import EngineWire
from gateway.errors import EngineBusy, EngineUnavailable, ServerSideError, UpstreamError
from shaping.confidence import TokenLogprob

ENGINE_REJECTED = "engine_rejected"  # the engine's own 4xx: our request was wrong, the engine is fine


def engine_failed(exc: BaseException) -> bool:
    """Whether an engine call's error says the engine is unhealthy (what a circuit breaker counts): not its
    own 4xx, and not its busy answer (back-pressure from a healthy engine)."""
    busy = isinstance(exc, EngineBusy)
    return isinstance(exc, ServerSideError) and exc.code != ENGINE_REJECTED and not busy


@dataclass(frozen=True, slots=True)
class EngineAnswer:
    """One engine call's answer and timings."""

    content: str | None
    reasoning: str | None
    finish_reason: str | None
    usage: Usage
    ttft_s: float | None
    total_s: float
    request_id: str
    streamed: bool
    # every generated token's logprob (reasoning and answer, in order); None when the engine sent none
    logprobs: tuple[TokenLogprob, ...] | None = None
    # whether those logprobs are over what the grammar allows (vLLM) or the raw logits (llama.cpp): the wire's
    logprobs_grammar_masked: bool = True
    engine: str = ""  # the base URL of the engine that answered (the verdict-reuse scope is its model's)


def logprob_entries(choice: dict[str, Any]) -> list[TokenLogprob] | None:
    """``choice.logprobs.content`` (vLLM's shape, streamed or not), or None when the engine sent none."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None
    return [TokenLogprob.from_wire(entry) for entry in logprobs["content"] if isinstance(entry, dict)]


def error_message(response: httpx.Response) -> str:
    """The engine's error message in OpenAI's shape, else the start of its body."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def refusal_error(wire: EngineWire, status: int, said: str) -> ServerSideError:
    """An engine's error answer as the gateway's error: its busy answer, its own 4xx (our request was
    wrong), 503 (unavailable) or another failure."""
    message = f"engine answered {status}: {wire.explain(said)}"
    if wire.says_busy(status, said):
        return EngineBusy(message)
    if 400 <= status < 500:
        return UpstreamError(message, code=ENGINE_REJECTED)
    return (EngineUnavailable if status == 503 else UpstreamError)(message)
