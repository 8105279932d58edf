"""The engine's own token counts for prefix planning, and the gateway's block-filling system prompt.

The maths is :mod:`shaping.prefix`; this module measures what it needs on the engine itself: its ``/tokenize``
renders the real chat template with the real tokenizer, its ``/metrics`` names its block size.

The shared prefix is measured, not guessed: two prompts that differ only in the first token of the user
message are tokenized and their common leading token ids counted. That is the system prompt and the chat
template up to the user's content, the part every request repeats.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.engine.calls import Purpose
from gateway.engine.client import EngineClient
from gateway.engine.wires import read_cache_config
from gateway.errors import ModgateError
from shaping.image import ShapedImage
from shaping.prefix import (
    DEFAULT_GUIDANCE_VERSION,
    BlockFill,
    FilledPrefix,
    guidance_version_for,
    load_guidance,
    shared_prefix_length,
)
from shaping.prompt import (
    RequestOptions,
    SystemPrompt,
    build_chat_request,
    load_system_prompt,
    prompt_version_for,
)
from shaping.verdict import DEFAULT_VERDICT_FORMAT, VerdictFormat


class PrefixPlanError(Exception):
    """The engine did not answer what prefix planning needs (``/tokenize``, ``/v1/models``, ``/metrics``)."""


@dataclass(frozen=True, slots=True)
class CachedCall:
    """One verification request and what the engine's usage said."""

    prompt_tokens: int
    cached_tokens: int


class EngineTokens:
    """Token counts and the block size, asked of one engine through its :class:`EngineClient`."""

    def __init__(self, http: EngineClient, model: str) -> None:
        self.http = http
        self.model = model

    @classmethod
    async def connect(cls, http: EngineClient) -> EngineTokens:
        """Ask the engine for its model id."""
        response = await _request(http, "GET", "/v1/models", "models")
        try:
            return cls(http, str(response.json()["data"][0]["id"]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise PrefixPlanError(f"the engine's /v1/models answered no model: {exc!r}") from exc

    async def token_ids(self, messages: list[dict[str, Any]], enable_thinking: bool = False) -> list[int]:
        """The prompt's token ids as the engine renders and tokenizes it (``POST /tokenize``)."""
        body = {
            "model": self.model, "messages": messages, "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": enable_thinking},
        }
        response = await _request(self.http, "POST", "/tokenize", "tokenize", json=body)
        try:
            tokens = response.json()["tokens"]
            return [int(token) for token in tokens]
        except (ValueError, KeyError, TypeError) as exc:
            raise PrefixPlanError(f"the engine's /tokenize answered no token ids: {exc!r}") from exc

    async def shared_prefix_tokens(self, system_text: str) -> int:
        """Tokens every request shares: the system prompt and the template up to the user's content."""
        first, second = await asyncio.gather(*(
            self.token_ids([{"role": "system", "content": system_text}, {"role": "user", "content": text}])
            for text in ("A", "B")  # one token each, different: the prompts part at the user's first token
        ))
        return shared_prefix_length(first, second)

    async def prompt_tokens(
        self, system: SystemPrompt, frames: list[ShapedImage], user_text: str, enable_thinking: bool
    ) -> int:
        """Every prompt token of one request as the gateway builds it."""
        body = self.chat_body(system, frames, user_text, enable_thinking)
        return len(await self.token_ids(body["messages"], enable_thinking))

    def chat_body(
        self,
        system: SystemPrompt,
        frames: list[ShapedImage],
        user_text: str,
        enable_thinking: bool,
        verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT,
    ) -> dict[str, Any]:
        """The gateway's engine request for these frames (not streamed, a few output tokens)."""
        options = RequestOptions(model=self.model, enable_thinking=enable_thinking, max_completion_tokens=8,
                                 constraint="regex", stream=False, verdict_format=verdict_format)
        return build_chat_request(system, list(frames), user_text, options)

    async def block_size(self) -> int | None:
        """The prefix-cache block size in ``vllm:cache_config_info``, if the engine exposes it."""
        response = await _request(self.http, "GET", "/metrics", "metrics")
        config = read_cache_config(response.text)
        return None if config is None else config.block_size

    async def cached_calls(
        self,
        system: SystemPrompt,
        frame_sets: list[list[ShapedImage]],
        user_text: str,
        enable_thinking: bool,
        verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT,
    ) -> list[CachedCall]:
        """Send one request per frame set, one after the other; what each reused from the prefix cache."""
        calls = []
        for frames in frame_sets:
            body = self.chat_body(system, frames, user_text, enable_thinking, verdict_format)
            response = await _request(self.http, "POST", "/v1/chat/completions", "probe", json=body)
            try:
                usage = response.json()["usage"]
                details = usage.get("prompt_tokens_details") or {}
                calls.append(CachedCall(int(usage["prompt_tokens"]), int(details.get("cached_tokens") or 0)))
            except (ValueError, KeyError, TypeError) as exc:
                raise PrefixPlanError(f"the engine's answer carries no usage: {exc!r}") from exc
        return calls


async def _request(
    engine: EngineClient, method: str, path: str, purpose: Purpose, json: Any = None
) -> httpx.Response:
    try:
        response = await engine.request(method, path, purpose=purpose, json=json)
    except ModgateError as exc:
        raise PrefixPlanError(f"engine {path} failed: {exc.message}") from exc
    if response.status_code != 200:
        raise PrefixPlanError(f"engine {path} answered {response.status_code}: {response.text[:200]}")
    return response


async def fill_prefix(
    engine: EngineTokens,
    base: SystemPrompt,
    block_size: int,
    guidance_version: str = DEFAULT_GUIDANCE_VERSION,
) -> FilledPrefix:
    """The least policy guidance that makes the shared prefix end on a whole block, measured on the engine."""
    search = BlockFill(base.text, load_guidance(guidance_version), block_size)
    while (candidate := search.next_candidate()) is not None:
        search.record(candidate, await engine.shared_prefix_tokens(candidate))
    return search.result()


async def fill_for_format(
    engine: EngineTokens, block_size: int, verdict_format: VerdictFormat
) -> tuple[SystemPrompt, FilledPrefix]:
    """The system prompt of ``verdict_format`` filled with the guidance that agrees with it."""
    version = prompt_version_for(verdict_format)
    guidance = guidance_version_for(verdict_format)
    filled = await fill_prefix(engine, load_system_prompt(version), block_size, guidance)
    return load_system_prompt(version, filled.guidance), filled


async def block_filled_prompt(
    http: EngineClient,
    block_size: int | None,
    verdict_format: VerdictFormat = DEFAULT_VERDICT_FORMAT,
) -> tuple[SystemPrompt, FilledPrefix]:
    """The canonical system prompt filled to the engine's next whole block (the gateway's, at start)."""
    engine = await EngineTokens.connect(http)
    prefix_reuse = (await http.wire()).prefix_reuse
    if prefix_reuse is not None:
        raise PrefixPlanError(
            f"{prefix_reuse}: there is no block to fill, the plain prompt's shared prefix is reused as it is "
            "(leave MODGATE_SHAPING__BLOCK_FILLING_PREFIX off)"
        )
    size = block_size or await engine.block_size()
    if size is None:
        raise PrefixPlanError(
            "the engine exposes no vllm:cache_config_info: set MODGATE_SHAPING__PREFIX_BLOCK_SIZE"
        )
    return await fill_for_format(engine, size, verdict_format)
