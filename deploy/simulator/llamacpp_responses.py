"""Responses in llama-server's shape: a chat completion whole or streamed, its usage, timings and logprobs.

From llama.cpp's tools/server/server-task.cpp (``to_json_oaicompat_chat``, ``..._stream``, the partial's
``to_json_oaicompat_chat``, ``probs_vector_to_json``) and server-common.cpp (``server_slot_stats::to_json``):

- the message has ``content`` ("" when there is none) and ``reasoning_content`` only when there is one
  (``--reasoning-format deepseek``); usage has ``prompt_tokens_details.cached_tokens`` alone, no
  ``completion_tokens_details``; ``timings`` (``cache_n``, ``prompt_n`` ...) ride beside it;
- a streamed chunk exists only for a token that changed the parsed message (``ParsedMessage``): the first
  token's chunk says ``{"role": "assistant", "content": null}``; the closing ``</think>``, blanks before
  the thought and the stop token change nothing, so no chunk (and no logprob entry) carries them; an
  unclosed thought is reasoning all the same; the whole answer lists every token, the stop token as
  ``""``; the finishing chunk's delta is ``{}``, the usage chunk (``include_usage``) has no choices and
  carries the timings, then ``[DONE]``;
- a logprob entry is ``id, token, bytes, logprob, top_logprobs`` (alternatives ``id, token, bytes,
  logprob``): exactly ``n_probs`` alternatives of a softmax over the raw logits, taken before the grammar
  (``get_token_probabilities`` in server-common.cpp), a probability of 0 in float written as the lowest
  float. The simulated model's raw softmax: where a grammar holds the answer, up to 60 % of it sits on
  tokens the grammar forbids (``OFF_GRAMMAR``: a line break, as the tiny test model's blank, ``The`` and
  ``**``; and ``TWINS`` of the chosen token, the near twins a trained model ranks beside it: ``Allow``,
  `` allow``, ``allowed``, ``blocked``) and the rest is the model's own distribution over what the grammar
  allows; so a short ``n_probs`` list holds forbidden tokens and leaves allowed ones out, and a reader that
  credited a twin to its action would read above the truth.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import string
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from litestar import Response
from litestar.response import Stream

from deploy.simulator.answers import END_OF_OUTPUT, THINK_END
from deploy.simulator.responses import Completion
from deploy.simulator.scheduler import FinishEvent, StepLoop, TokenEvent
from shaping.bpe import QwenBPE

LLAMACPP_ZERO_LOGPROB = -3.4028234663852886e38  # std::numeric_limits<float>::lowest(): llama-server's log(0)
# what the raw softmax puts on tokens the grammar forbids, at each answer token (0.6 with all three twins)
# (the line break above the 0.4 left to what the grammar allows: the best listed token is forbidden)
OFF_GRAMMAR: tuple[tuple[str, float], ...] = (("\n", 0.41), ("The", 0.01), ("**", 0.01))
# the chosen token's twins the grammar forbids at its place, each a function of it, with its share
TWINS: tuple[tuple[Callable[[str], str], float], ...] = (
    (str.capitalize, 0.07),  # Allow, Block, Viol
    (lambda token: " " + token, 0.05),  # a blank before it (none is allowed in a compact verdict)
    (lambda token: token + "ed", 0.05),  # allowed, blocked, reviewed
)
SYSTEM_FINGERPRINT = "b11434-modgate-sim"  # llama_build_info(): the tree's build number, then the commit


@dataclass
class ServedTotals:
    """What ``/metrics`` sums over finished requests (the scheduler counts tokens; this counts time)."""

    prompt_seconds: float = 0.0
    predicted_seconds: float = 0.0
    tokens_max: int = 0


@dataclass(frozen=True, slots=True)
class LlamaCppCompletion:
    """A completion as llama-server answers it: the planned run plus what its shape needs."""

    completion: Completion
    bpe: QwenBPE
    constrained: bool  # a grammar holds the answer: the raw logprobs put mass where it forbids
    totals: ServedTotals = field(default_factory=ServedTotals)


@dataclass
class ParsedMessage:
    """The message llama-server's reasoning parser reads from the tokens so far (``--reasoning-format
    deepseek``, the template's ``<think>\n ... \n</think>\n\n``): ``feed`` answers each token's change.

    Blanks before the thought's first word change nothing (the parsed thought is trimmed: a thought of
    blanks is no ``reasoning_content``); the closing tag and up to the two line breaks the template writes
    after it belong to no field; the stop token writes nothing.
    """

    reasoning: str = ""
    content: str = ""
    closed: bool = False
    _breaks: int = 0  # line breaks eaten after the closing tag

    def feed(self, event: TokenEvent) -> dict[str, str]:
        if event.text == END_OF_OUTPUT:
            return {}
        if event.text == THINK_END:
            self.closed = True
            return {}
        text = event.text
        if event.channel == "reasoning":
            if not self.reasoning.strip() and not text.strip():
                self.reasoning += text
                return {}
            delta = text if self.reasoning.strip() else text.lstrip()
            self.reasoning += text
            return {"reasoning_content": delta}
        if self.closed and not self.content:
            while text.startswith("\n") and self._breaks < 2:
                text, self._breaks = text[1:], self._breaks + 1
        self.content += text
        return {"content": text} if text else {}

    def message(self) -> dict[str, Any]:
        """``common_chat_msg::to_json_oaicompat``: content ("" when none), then the thought if any."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning.strip():
            message["reasoning_content"] = self.reasoning.strip()
        return message


def streamed(scheduler: StepLoop, run: LlamaCppCompletion, include_usage: bool) -> Stream:
    """The completion as server-sent chunks, a chunk per token that writes text, as llama-server streams."""
    completion = run.completion
    sequence = completion.sequence

    async def stream() -> AsyncIterator[bytes]:
        if completion.slow:
            await asyncio.sleep(completion.slow)
        first, sent = True, 0
        parsed = ParsedMessage()
        async for event in scheduler.generate(sequence):
            if isinstance(event, TokenEvent):
                sent += 1
                if event.text == END_OF_OUTPUT:
                    continue  # it ends the answer and writes nothing: no partial result is sent for it
                deltas: list[dict[str, Any]] = [{"role": "assistant", "content": None}] if first else []
                first = False
                change = parsed.feed(event)  # none for the closing tag or a blank before the thought
                if change:
                    deltas.append(change)
                for index, delta in enumerate(deltas):
                    choice: dict[str, Any] = {"finish_reason": None, "index": 0, "delta": delta}
                    if completion.logprobs and index == len(deltas) - 1:
                        choice["logprobs"] = {"content": [logprob_entry(run, event)]}
                    yield _event(_chunk(completion, [choice]))
                if completion.cut and sent >= max(1, len(sequence.output) // 2):
                    return  # the connection ends mid-answer, with no finish and no [DONE]
                continue
            finish = _chunk(completion, [{"finish_reason": event.finish_reason, "index": 0, "delta": {}}])
            chunks = [finish]
            if include_usage:
                chunks.append({**_chunk(completion, []), "usage": usage(event)})
            chunks[-1]["timings"] = timings(run, event, time.monotonic())
            for index, chunk in enumerate(chunks):
                yield _event(chunk)
                if index == 0:  # resumed: the finishing chunk went out
                    scheduler.counters.answers_whole += 1
        yield b"data: [DONE]\n\n"

    return Stream(stream(), media_type="text/event-stream")


async def whole(scheduler: StepLoop, run: LlamaCppCompletion) -> Response[Any]:
    """The completion in one body, once the scheduler has run it to its end."""
    completion = run.completion
    if completion.slow:
        await asyncio.sleep(completion.slow)
    generated: list[TokenEvent] = []
    finish: FinishEvent | None = None
    async for event in scheduler.generate(completion.sequence):
        if isinstance(event, TokenEvent):
            generated.append(event)
        else:
            finish = event
    assert finish is not None  # generate() always ends with a FinishEvent
    if completion.cut:
        return Response(b'{"choices": [{"finish_reason"', media_type="application/json")
    scheduler.counters.answers_whole += 1
    parsed = ParsedMessage()
    for event in generated:
        parsed.feed(event)
    choice: dict[str, Any] = {"finish_reason": finish.finish_reason, "index": 0, "message": parsed.message()}
    if completion.logprobs:
        choice["logprobs"] = {"content": [logprob_entry(run, e) for e in generated]}
    return Response(
        {
            "choices": [choice],
            "created": completion.created,
            "model": completion.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "object": "chat.completion",
            "usage": usage(finish),
            "id": completion.request_id,
            "timings": timings(run, finish, time.monotonic()),
        }
    )


def usage(finish: FinishEvent) -> dict[str, Any]:
    """``usage_json_oaicompat``: the cached tokens only, no reasoning or image counts."""
    return {
        "completion_tokens": finish.completion_tokens,
        "prompt_tokens": finish.prompt_tokens,
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    }


def timings(run: LlamaCppCompletion, finish: FinishEvent, now: float) -> dict[str, Any]:
    """``server_slot_stats::to_json``: prompt evaluation (cached tokens apart) and generation, in ms.

    The prompt's time runs from arrival to the first token (a wait for a slot included); a rate over no
    time is what llama-server writes for infinity, null.
    """
    sequence = run.completion.sequence
    first = sequence.first_token_at or now
    prompt_ms = (first - sequence.arrival) * 1e3
    predicted_ms = (now - first) * 1e3
    prompt_n, predicted_n = finish.prompt_tokens - finish.cached_tokens, finish.completion_tokens
    totals = run.totals
    totals.prompt_seconds += prompt_ms / 1e3
    totals.predicted_seconds += predicted_ms / 1e3
    totals.tokens_max = max(totals.tokens_max, finish.prompt_tokens + finish.completion_tokens)
    return {
        "cache_n": finish.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else None,
        "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else None,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else None,
        "predicted_per_second": 1e3 / predicted_ms * predicted_n if predicted_ms > 0 else None,
    }


def token_id(bpe: QwenBPE, text: str) -> int:
    """A token's vocabulary id (a special token by name; else the id of its one piece)."""
    try:
        return bpe.special(text)
    except KeyError:
        ids = bpe.encode(text)
        return ids[0] if ids else 0


def logprob_entry(run: LlamaCppCompletion, event: TokenEvent) -> dict[str, Any]:
    """One token in llama-server's ``logprobs.content`` shape, ``n_probs`` raw-softmax alternatives."""
    bpe, top = run.bpe, run.completion.top
    text = "" if event.text == END_OF_OUTPUT else event.text  # the stop token's text_to_send is empty
    alternatives = list(event.alternatives) or [(event.text, event.logprob)]
    if run.constrained and event.channel == "content" and event.text not in (END_OF_OUTPUT, THINK_END):
        forbidden = forbidden_beside(event.text, {token for token, _ in alternatives})
        kept = math.log1p(-sum(forbidden.values()))
        alternatives = [(token, math.log(share)) for token, share in forbidden.items()] + [
            (token, logprob + kept) for token, logprob in alternatives if token not in forbidden
        ]
    chosen = dict(alternatives).get(event.text, event.logprob)
    listed = dict(alternatives)
    fillers = (t for t in _fillers(bpe) if t not in listed)  # lazily: each one taken is listed
    while len(alternatives) < top:
        alternatives.append((filler := next(fillers), LLAMACPP_ZERO_LOGPROB))
        listed[filler] = LLAMACPP_ZERO_LOGPROB
    alternatives.sort(key=lambda pair: -pair[1])
    return {
        "id": token_id(bpe, event.text),
        "token": text,
        "bytes": list(text.encode()),
        "logprob": chosen,
        "top_logprobs": [
            {
                "id": token_id(bpe, token),
                "token": "" if token == END_OF_OUTPUT else token,
                "bytes": list(("" if token == END_OF_OUTPUT else token).encode()),
                "logprob": logprob,
            }
            for token, logprob in alternatives[:top]
        ],
    }


def forbidden_beside(chosen: str, allowed: set[str]) -> dict[str, float]:
    """The raw softmax's share of each token the grammar forbids where ``chosen`` was written: the fixed
    ones and ``chosen``'s twins (a twin that is the token itself or an allowed alternative is none)."""
    forbidden = dict(OFF_GRAMMAR)
    for twin_of, share in TWINS:
        twin = twin_of(chosen)
        if twin != chosen and twin not in allowed and twin not in forbidden:
            forbidden[twin] = share
    return forbidden


def _fillers(bpe: QwenBPE) -> Iterator[str]:
    """Tokens at 0 in float that pad a list to ``n_probs`` (llama.cpp sets no limit on it): punctuation,
    letters and digits, then the vocabulary's own tokens."""
    yield from ("{", "}", '"', ":", ",", *string.ascii_letters, *string.digits)
    yield from (bpe.text_of(token) for token in itertools.count(1000))


def _chunk(completion: Completion, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "choices": choices,
        "created": completion.created,
        "id": completion.request_id,
        "model": completion.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "object": "chat.completion.chunk",
    }


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
