"""The simulated engine's tokenizer: Qwen's real BPE (shaping.bpe) and its ChatML chat template.

A prompt is rendered the way vLLM renders it (the template to one string, then the tokenizer over the whole
string, so merges across a message's text are the model's own), except that an image is a run of
:class:`ImageSlot` positions carrying the image's identity, so the prefix cache hashes it with the block as
vLLM does. Which family's vocabulary is used is the preset's ``tokenizer`` (``qwen3.6`` for the Spark).
"""

from __future__ import annotations

from dataclasses import dataclass

from shaping.bpe import QwenBPE, qwen_bpe

IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True, slots=True)
class ImageSlot:
    """One image token position: which image, which of its tokens."""

    identity: str
    index: int


Token = int | ImageSlot


def token_id(token: Token, bpe: QwenBPE) -> int:
    """The id ``/tokenize`` answers for a token (an image position is the image pad token, as in vLLM)."""
    return bpe.special(IMAGE_PAD) if isinstance(token, ImageSlot) else token


def render_chat(
    messages: list[tuple[str, list[ImageSlot | str]]],
    enable_thinking: bool,
    add_generation_prompt: bool = True,
    *,
    bpe: QwenBPE | None = None,
) -> list[Token]:
    """Qwen's template: ``<|im_start|>role\\n … <|im_end|>\\n``, then the assistant header if asked
    (``bpe``: whose tokens, by default the Spark's family)."""
    bpe = bpe or qwen_bpe()
    tokens: list[Token] = []
    text = ""
    for role, parts in messages:
        text += f"<|im_start|>{role}\n"
        for part in parts:
            if isinstance(part, str):
                text += part
            else:
                tokens += bpe.encode(text)
                text = ""
                tokens.append(part)
        text += "<|im_end|>\n"
    if add_generation_prompt:  # the empty thinking block belongs to the assistant header, as in Qwen's
        text += bpe.generation_prompt(enable_thinking)
    return tokens + bpe.encode(text)
