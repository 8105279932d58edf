"""Responses in vLLM's shape: a chat completion whole or as server-sent chunks, its usage and its logprobs."""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from litestar import Response
from litestar.response import Stream

from deploy.simulator.answers import END_OF_OUTPUT, MASKED_LOGPROB, THINK_END
from deploy.simulator.protocol import DecodedImage
from deploy.simulator.scheduler import FinishEvent, Sequence, StepLoop, TokenEvent


@dataclass(frozen=True, slots=True)
class Completion:
    """One chat completion as the route planned it: the sequence to run and how to answer with it."""

    request_id: str
    model: str
    created: int
    sequence: Sequence
    images: list[DecodedImage]
    logprobs: bool
    top: int  # alternatives per token in the logprobs
    slow: float  # seconds to wait before the first token (a fault; 0 for none)
    cut: bool  # end the answer half-way (a fault)


def streamed(scheduler: StepLoop, completion: Completion, include_usage: bool) -> Stream:
    """The completion as server-sent chunks, as vLLM streams them; the scheduler runs it as it is read."""
    request_id, model, created = completion.request_id, completion.model, completion.created
    sequence, top = completion.sequence, completion.top

    async def stream() -> AsyncIterator[bytes]:
        if completion.slow:
            await asyncio.sleep(completion.slow)
        yield _chunk(request_id, model, created, {"role": "assistant", "content": ""}, None)
        sent = 0
        last: TokenEvent | None = None
        async for event in scheduler.generate(sequence):
            if isinstance(event, TokenEvent):
                sent += 1
                if event.text == END_OF_OUTPUT:  # as vLLM: the stop token rides on the finishing chunk
                    last = event
                    continue
                # as vLLM's reasoning parser: the closing tag's chunk has an empty delta, and logprobs
                delta: dict[str, Any] = {} if event.text == THINK_END else {event.channel: event.text}
                entries = [logprob_entry(event, top)] if completion.logprobs else None
                yield _chunk(request_id, model, created, delta, None, entries)
                if completion.cut and sent >= max(1, len(sequence.output) // 2):
                    return  # the connection ends mid-answer, with no finish and no [DONE]
                continue
            entries = [logprob_entry(last, top)] if completion.logprobs and last is not None else None
            final: dict[str, Any] = {"content": ""} if last else {}
            yield _chunk(request_id, model, created, final, event.finish_reason, entries)
            scheduler.counters.answers_whole += 1  # resumed: the finishing chunk went out
            if include_usage:
                usage_chunk = {
                    "id": request_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage(event, completion.images),
                }
                yield b"data: " + json.dumps(usage_chunk).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return Stream(stream(), media_type="text/event-stream")


async def whole(scheduler: StepLoop, completion: Completion) -> Response[Any]:
    """The completion in one body, once the scheduler has run it to its end."""
    if completion.slow:
        await asyncio.sleep(completion.slow)
    reasoning: list[str] = []
    content: list[str] = []
    generated: list[TokenEvent] = []
    finish: FinishEvent | None = None
    async for event in scheduler.generate(completion.sequence):
        if isinstance(event, TokenEvent):
            generated.append(event)
            if event.text not in (END_OF_OUTPUT, THINK_END):
                (reasoning if event.channel == "reasoning" else content).append(event.text)
        else:
            finish = event
    assert finish is not None  # generate() always ends with a FinishEvent
    if completion.cut:
        return Response(
            b'{"id": "' + completion.request_id.encode() + b'", "choices": [',
            media_type="application/json",
        )
    scheduler.counters.answers_whole += 1
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(content) if content else None,
        "reasoning": "".join(reasoning) if reasoning else None,
        "tool_calls": [],
    }
    return Response(
        {
            "id": completion.request_id,
            "object": "chat.completion",
            "created": completion.created,
            "model": completion.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": (
                        {"content": [logprob_entry(e, completion.top) for e in generated]}
                        if completion.logprobs
                        else None
                    ),
                    "finish_reason": finish.finish_reason,
                }
            ],
            "usage": usage(finish, completion.images),
        },
    )


def usage(finish: FinishEvent, images: list[DecodedImage]) -> dict[str, Any]:
    """``usage`` as vLLM reports it with ``--enable-prompt-tokens-details``."""
    return {
        "prompt_tokens": finish.prompt_tokens,
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
        "completion_tokens": finish.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": finish.cached_tokens,
            "created_cache_tokens": finish.created_cache_tokens,
            "multimodal_tokens": {"image": sum(image.tokens for image in images)},
        },
        "completion_tokens_details": {"reasoning_tokens": finish.reasoning_tokens},
    }


def _chunk(
    request_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish: str | None,
    logprobs: list[dict[str, Any]] | None = None,
) -> bytes:
    body = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish,
            }
        ],
    }
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def logprob_entry(event: TokenEvent, top: int) -> dict[str, Any]:
    """One token in vLLM's ``logprobs.content`` shape: token, logprob, bytes and ``top`` alternatives.

    As vLLM: exactly ``top`` alternatives (padded with tokens the grammar masked, at -9999.0).
    """
    alternatives = list(event.alternatives) or [(event.text, event.logprob)]
    listed = dict(alternatives)
    # masked tokens to pad with: single printable characters, enough for vLLM's largest list (20)
    fillers = (t for t in ("{", "}", '"', ":", ",", *string.ascii_letters, *string.digits) if t not in listed)
    while len(alternatives) < top:
        alternatives.append((next(fillers), MASKED_LOGPROB))
    return {
        "token": event.text,
        "logprob": event.logprob,
        "bytes": list(event.text.encode()),
        "top_logprobs": [
            {"token": token, "logprob": logprob, "bytes": list(token.encode())}
            for token, logprob in alternatives[:top]
        ],
    }
