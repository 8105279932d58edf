"""A deterministic stand-in for the model's tokenizer and Qwen-style chat template.

It is not the real tokenizer; it is stable, cheap, and close to the Spark's counts for the canonical
prompt (about 400 tokens for its ~700 characters). Image placeholders carry the image's identity so the
prefix cache hashes it with the block, as vLLM does.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

_TOKEN = re.compile(
    r"[\u3400-\u9fff\uf900-\ufaff]{1,2}|[A-Za-z]{1,8}|[0-9]|\n|[ \t]+|[^\sA-Za-z0-9\u3400-\u9fff]"
)
VOCAB_SIZE = 151_936


@dataclass(frozen=True, slots=True)
class ImageSlot:
    """One image token position: which image, which of its tokens."""

    identity: str
    index: int


Token = str | ImageSlot


def split_text(text: str) -> list[str]:
    """Text into token pieces."""
    return _TOKEN.findall(text)


def token_id(token: Token) -> int:
    """A stable integer id for a token piece (what ``/tokenize`` answers)."""
    if isinstance(token, ImageSlot):
        return 151_655  # Qwen's image pad token
    return zlib.crc32(token.encode()) % VOCAB_SIZE


def render_chat(
    messages: list[tuple[str, list[Token | str]]], enable_thinking: bool, add_generation_prompt: bool = True
) -> list[Token]:
    """Qwen-style template: ``<|im_start|>role\\n … <|im_end|>\\n``, then the assistant header if asked."""
    tokens: list[Token] = []
    for role, parts in messages:
        tokens += ["<|im_start|>", role, "\n"]
        for part in parts:
            tokens += split_text(part) if isinstance(part, str) else [part]
        tokens += ["<|im_end|>", "\n"]
    if not add_generation_prompt:  # the empty thinking block belongs to the assistant header, as in Qwen's
        return tokens
    tokens += ["<|im_start|>", "assistant", "\n"]
    if not enable_thinking:
        tokens += ["<think>", "\n\n", "</think>", "\n\n"]
    return tokens
