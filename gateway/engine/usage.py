"""An engine call's token counts, as the OpenAI-compatible ``usage`` object says them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one engine call (missing details read as 0, as older servers omit them)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    created_cache_tokens: int = 0
    image_tokens: int | None = 0  # None: the engine counts none (llama.cpp), which is not "no image tokens"
    reasoning_tokens: int = 0

    @classmethod
    def from_wire(cls, usage: dict[str, Any] | None, counts_images: bool = True) -> Usage:
        """Read vLLM's ``usage`` object (``counts_images`` False: an engine that gives no image count)."""
        usage = usage or {}
        prompt_details = usage.get("prompt_tokens_details") or {}
        completion_details = usage.get("completion_tokens_details") or {}
        multimodal = prompt_details.get("multimodal_tokens") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(prompt_details.get("cached_tokens") or 0),
            created_cache_tokens=int(prompt_details.get("created_cache_tokens") or 0),
            image_tokens=int(multimodal.get("image") or 0) if counts_images else None,
            reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
        )


@dataclass(frozen=True, slots=True)
class PlaceAnswer:
    """A verdict-place probe's answer: the distribution it read (None: none) and what it cost the engine."""

    alternatives: tuple[tuple[str, float], ...] | None
    usage: Usage
