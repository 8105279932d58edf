"""The engine side of ``POST /v1/decisions``: each question's distribution asked place by place through the
engine client (purpose ``decision``: the circuit breaker and ``modgate_engine_calls_total`` apply; the
caller holds the engine slot, so the cap, the priority and the fair share do), and the primer that keeps a
hybrid engine's state at the end of the shared input.

The walk itself (which places, how a list is read) is pure: :mod:`shaping.decisions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final

from gateway.engine.answers import ENGINE_REJECTED, refusal_error
from gateway.engine.client import EngineClient
from gateway.engine.usage import PlaceAnswer, Usage
from gateway.errors import EngineUnavailable, UpstreamError
from shaping.confidence import TokenLogprob, answer_start, probability
from shaping.decisions import Distribution, DistributionWalk, thought_then

DECISION_TOP_LOGPROBS: Final = 20
"""Alternatives asked at each place of an answer: vLLM's default ``--max-logprobs`` (an engine started with
less refuses the question: its refusal says so). Every token the answer grammar admits there should be
listed, and a choice's values admit their partial first pieces too (``c``, ``ca``, ``cat``)."""


class QuestionRejected(UpstreamError):
    """The engine refused a question's request as sent (its own 4xx: a question past its context, say)."""


def _message(response_body: Any, fallback: str) -> str:
    try:
        return str(response_body["error"]["message"])
    except (KeyError, TypeError):
        return fallback


def _answered(response: Any, wire: Any) -> dict[str, Any]:
    """A place's answer as a JSON object, or the gateway's error for the engine's (its own 4xx: the
    question's refusal)."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    status = response.status_code
    if status != 200:
        error = refusal_error(wire, status, _message(payload, response.text[:200]))
        if error.code == ENGINE_REJECTED:
            raise QuestionRejected(error.message, code=ENGINE_REJECTED)
        raise error
    if not isinstance(payload, dict):
        raise UpstreamError("engine answered a decision place with a body that is not a JSON object")
    return payload


async def think_first(
    client: EngineClient, body: dict[str, Any], regex: str, *, top_logprobs: int, request_id: str
) -> tuple[PlaceAnswer, str]:
    """Thinking on: the model thinks, then answers under the grammar; the answer's first place is read from
    that answer's own logprobs (the list at its first token). Answers the place and the thought."""
    wire = await client.wire()
    ask = {key: value for key, value in body.items() if key not in {"stream", "stream_options"}}
    ask.update(structured_outputs={"regex": regex}, logprobs=True, top_logprobs=top_logprobs)
    response = await client.request(
        "POST", "/v1/chat/completions", purpose="decision", json=wire.chat_body(ask), request_id=request_id
    )
    payload = _answered(response, wire)
    usage = payload.get("usage")
    cost = Usage.from_wire(usage if isinstance(usage, dict) else None, wire.counts_image_tokens)
    try:
        choice = payload["choices"][0]
        message = choice["message"]
        content = str(message.get("content") or "")
        thought = str(message.get("reasoning") or message.get("reasoning_content") or "")
        entries = [TokenLogprob.from_wire(entry) for entry in choice["logprobs"]["content"]]
    except (KeyError, IndexError, TypeError):
        return PlaceAnswer(None, cost), ""
    if "</think>" in content:  # a thought the engine left in the content
        thought, _, content = content.rpartition("</think>")
        thought = thought.removeprefix("<think>")
    start = answer_start(entries, content)
    if start is None:
        return PlaceAnswer(None, cost), thought
    alternatives = tuple((text, probability(logprob)) for text, logprob in entries[start].alternatives())
    return PlaceAnswer(alternatives, cost), thought


async def ask_place(
    client: EngineClient, body: dict[str, Any], before: str, regex: str, *, top_logprobs: int, seed: int,
    request_id: str,
) -> PlaceAnswer:
    """One place of an answer: the engine's (token, probability) list after ``before`` and what it cost."""
    wire = await client.wire()
    probe = wire.decision_place({**body, "seed": seed}, before, regex, top_logprobs)
    response = await client.request(
        "POST", "/v1/chat/completions", purpose="decision", json=probe, request_id=request_id
    )
    payload = _answered(response, wire)
    usage = payload.get("usage")
    cost = Usage.from_wire(usage if isinstance(usage, dict) else None, wire.counts_image_tokens)
    return PlaceAnswer(wire.read_decision_place(payload), cost)


@dataclass
class QuestionCost:
    """What one question's places cost the engine (summed usage)."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    created_cache_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    prompts: list[tuple[int, int]] = field(default_factory=list)  # (prompt, cached) of each call

    def add(self, usage: Usage) -> None:
        """Count one call."""
        self.calls += 1
        self.prompt_tokens += usage.prompt_tokens
        self.cached_tokens += usage.cached_tokens
        self.created_cache_tokens += usage.created_cache_tokens
        self.completion_tokens += usage.completion_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.prompts.append((usage.prompt_tokens, usage.cached_tokens))

    def merge(self, other: QuestionCost) -> None:
        """Count another slot's calls (every field is a sum)."""
        for counted in fields(self):
            setattr(self, counted.name, getattr(self, counted.name) + getattr(other, counted.name))


async def question_distribution(
    client: EngineClient, body: dict[str, Any], walk: DistributionWalk, *, top_logprobs: int, probes: int,
    request_id: str, cost: QuestionCost, thinking: bool = False,
) -> Distribution:
    """Walk one question's places on ``client`` (in the caller's engine slot, one call at a time).

    On an engine whose list is not grammar-masked (llama.cpp) a place that reads inexact is drawn again with
    another seed, up to ``probes`` draws (its list is the grammar's only where the first draw was one the
    grammar forbids); a masked list is the grammar's already, so one call a place."""
    masked = (await client.wire()).logprobs_grammar_masked
    draws = 1 if masked else max(1, probes)
    thought: str | None = None
    if thinking:  # the first place is the thinking answer's own; a thought is not drawn again
        place, thought = await think_first(
            client, body, walk.regex(""), top_logprobs=top_logprobs, request_id=request_id
        )
        cost.add(place.usage)
        walk.record("", place.alternatives)
        # later places continue after the thought, which the template wrote: nothing more to think
        body = {**body, "chat_template_kwargs": {"enable_thinking": False}}
        body.pop("thinking_token_budget", None)
    while (before := walk.next_place()) is not None:
        regex = walk.regex(before)
        sent = before if thought is None else thought_then(thought, before)
        for seed in range(draws):
            place = await ask_place(
                client, body, sent, regex, top_logprobs=top_logprobs, seed=seed, request_id=request_id
            )
            cost.add(place.usage)
            if walk.record(before, place.alternatives, final=seed == draws - 1):
                break
    return walk.result()


async def prime_input(
    client: EngineClient, body: dict[str, Any], request_id: str, cost: QuestionCost
) -> None:
    """One request whose prompt ends where the shared input does (``body``: its messages, the last one
    continued where a ``prompt_cache_breakpoint`` cut it): a hybrid engine keeps its linear-attention state
    there, so every question takes the input from the cache (docs/prefix-strategy.md). Best effort: a primer
    that fails leaves the questions uncached, never failed."""
    wire = await client.wire()
    primer = {key: value for key, value in body.items() if key not in {"stream", "stream_options"}}
    primer.update(max_completion_tokens=1, add_generation_prompt=False, continue_final_message=True)
    try:
        response = await client.request(
            "POST", "/v1/chat/completions", purpose="primer", json=wire.chat_body(primer),
            request_id=request_id,
        )
        payload = response.json() if response.status_code == 200 else None
    except (EngineUnavailable, UpstreamError, ValueError):
        return
    if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
        cost.add(Usage.from_wire(payload["usage"], wire.counts_image_tokens))
