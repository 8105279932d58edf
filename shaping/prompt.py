"""The canonical system prompt and the engine request built around it.

The system prompt is the only part every request shares, so it must be byte-identical across requests
(and first) for the engine's prefix cache to have any chance: one file, one normalization, one version.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Protocol

from shaping import verdict

DEFAULT_PROMPT_VERSION = "v1"
# The system prompt that asks for each verdict format: v1 the JSON object, v2 the compact line.
PROMPT_VERSIONS: dict[verdict.VerdictFormat, str] = {"json": "v1", "compact": "v2"}


def prompt_version_for(verdict_format: verdict.VerdictFormat) -> str:
    """The prompt version that asks for ``verdict_format``."""
    return PROMPT_VERSIONS[verdict_format]


def normalize_prompt(text: str) -> str:
    """Unicode NFC, ``\\n`` line endings, no trailing whitespace on any line, one final newline stripped."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    """The canonical system prompt of one version."""

    version: str
    text: str

    @property
    def sha256(self) -> str:
        """Content hash: what a cache or an audit entry names the prompt by."""
        return _sha256_of(self.text)


@lru_cache(maxsize=64)
def _sha256_of(text: str) -> str:
    """A prompt's hash, once per text (it is read for every request; the prompts are a handful)."""
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def load_system_prompt(version: str = DEFAULT_PROMPT_VERSION, extra_guidance: str = "") -> SystemPrompt:
    """Read a versioned system prompt shipped in the package, normalized.

    ``extra_guidance`` is appended (policy text that pads the shared prefix to whole cache blocks).
    """
    raw = resources.files("shaping.prompts").joinpath(f"system.{version}.txt").read_text(encoding="utf-8")
    text = normalize_prompt(raw)
    if extra_guidance:
        text = normalize_prompt(text + "\n" + extra_guidance)
    return SystemPrompt(version=version, text=text)


class EngineImage(Protocol):
    """What the request builder needs of a shaped keyframe."""

    @property
    def data_url(self) -> str: ...

    @property
    def sha256(self) -> str: ...


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """Per-request choices that change the engine request."""

    model: str
    enable_thinking: bool
    max_completion_tokens: int
    constraint: str = "json_schema"  # or "regex": how the JSON format is held (the compact one is a regex)
    stream: bool = True
    priority: int | None = None
    thinking_token_budget: int | None = None
    verdict_format: verdict.VerdictFormat = "json"
    top_logprobs: int = 0  # > 0: ask for each token's logprob and this many alternatives (confidence)


def user_content(images: list[EngineImage], user_text: str) -> list[dict[str, Any]]:
    """``[image_url, …, text]``: images first, then the fixed instruction."""
    parts: list[dict[str, Any]] = [
        # uuid: the image's cache identity in the engine; the content hash keeps it unique per content.
        {"type": "image_url", "image_url": {"url": image.data_url}, "uuid": image.sha256}
        for image in images
    ]
    parts.append({"type": "text", "text": user_text})
    return parts


def build_chat_request(
    system: SystemPrompt,
    images: list[EngineImage],
    user_text: str,
    options: RequestOptions,
) -> dict[str, Any]:
    """The body of ``POST /v1/chat/completions`` for one or more keyframes (one verdict each), or for a
    text-only input (no image: one verdict on the text)."""
    # A text-only request (no image) is still one verdict: never the packed shape with zero frames.
    frames = max(1, len(images))
    body: dict[str, Any] = {
        "model": options.model,
        "messages": [
            {"role": "system", "content": system.text},
            {"role": "user", "content": user_content(images, user_text)},
        ],
        "max_completion_tokens": options.max_completion_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": options.enable_thinking},
    }
    # a text-only request (no frame) still gets one verdict
    body.update(verdict.structured_outputs(options.verdict_format, options.constraint, max(1, frames)))
    if options.top_logprobs > 0:
        body["logprobs"] = True
        body["top_logprobs"] = options.top_logprobs
    if options.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if options.priority is not None:
        body["priority"] = options.priority
    if options.enable_thinking and options.thinking_token_budget is not None:
        body["thinking_token_budget"] = options.thinking_token_budget
    return body
