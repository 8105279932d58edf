"""Simulated engine presets: the Spark's calibration and an instant one for tests."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shaping.bpe import DEFAULT_FAMILY, Family

SPARK_PREFILL_TOKENS_PER_S = 3500.0
SPARK_DECODE_TOKENS_PER_S = 96.0


@dataclass(frozen=True, slots=True)
class SimPreset:
    """What the simulated engine is and how fast it is, before ``time_scale``."""

    name: str
    model: str
    model_root: str = ""  # what /v1/models says in ``root`` (vLLM: the weights' path); empty: the model id
    tokenizer: Family = DEFAULT_FAMILY  # whose BPE counts the prompt (shaping.bpe): the Spark's Qwen3.5/3.6
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 4096
    max_model_len: int = 131072
    block_size: int = 2960  # the hybrid model's KV block: a 1,076-token request never fills one
    kv_cache_blocks: int = 2048  # prefix-cache capacity in blocks, evicted least recently used
    # Fitted to the Spark's tuned configuration (bench/calibration.py, docs/simulator.md): a step costs its
    # prefill tokens at PREFILL plus its decode tokens at DECODE tokens/s in aggregate (flat whatever the
    # batch: an MoE whose sequences touch different experts). Prefill stalls the batch, so measured
    # generation (73-86 tokens/s) sits below the pure decode rate and throughput barely depends on the
    # concurrency, while TTFT and end to end do. Two free constants against two independent figures
    # (end to end follows from the rate by Little's law): a fit, checked out of sample on the held-out
    # rows (MTP on, the fork's prefill cap), not tuned to them.
    prefill_tokens_per_s: float = SPARK_PREFILL_TOKENS_PER_S
    decode_tokens_per_s: float = SPARK_DECODE_TOKENS_PER_S
    step_overhead_s: float = 0.0
    # Speculative decoding (vLLM's --speculative-config; MTP on the Spark): drafts per step, and the share
    # of drafts the target model accepts (the Spark: 1.6 of 4, 39.9 %; a property of model and workload).
    num_speculative_tokens: int = 0
    draft_acceptance_rate: float = 0.399
    # Prefill scheduling knobs (None or 0: off, as on the tuned engine): vLLM's
    # --long-prefill-token-threshold (per sequence per step), --no-enable-chunked-prefill, and the Spark
    # fork's --max-num-prefill-tokens-per-step, --max-parallel-prefills, --prefill-compute-share.
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    max_num_prefill_tokens_per_step: int | None = None
    max_parallel_prefills: int | None = None
    prefill_compute_share: float | None = None
    pixels_per_token: int = 32  # Qwen3-VL family: one image token per 32×32 pixels
    max_image_pixels: int = 16384 * 32 * 32
    reasoning_tokens: int = 70  # with the ~25-token verdict: about 95 output tokens with thinking on
    reasoning_jitter: int = 10  # ± spread, deterministic per image
    # Per-frame ground truth (deploy.simulator.truth): the share of frames whose thinking-off verdict
    # differs, and how well the thinking-off confidence separates them (AUROC, binormal). The design's
    # defaults; benchmarks show 0.75 and 0.95 beside 0.85, never a separation picked to meet a target.
    thinking_off_disagreement: float = 0.06
    separation_auroc: float = 0.85
    scheduling_policy: str = "fcfs"  # or "priority": lower ``priority`` first

    @property
    def output_token_weight(self) -> float | None:
        """One output token's engine time in prompt tokens' (the fair share's work weight, docs/tenants.md):
        decode costs 1 / decode_tokens_per_s of the engine per token in aggregate, prefill 1 /
        prefill_tokens_per_s. None for a preset that costs no time (instant)."""
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            return None
        return self.prefill_tokens_per_s / self.decode_tokens_per_s

    def scaled(self, **changes: object) -> SimPreset:
        """A copy with some fields changed (from the command line)."""
        # replace() types **changes field by field; the command line hands over checked values as object.
        return replace(self, **changes)  # type: ignore[arg-type]  # values checked, typed object


PRESETS: dict[str, SimPreset] = {
    "spark": SimPreset(name="spark", model="qwen3-vl-moe-sim"),
    # Instant: a tiny engine with a small block so that prefix caching can be seen in a few requests.
    "instant": SimPreset(
        name="instant",
        model="qwen3-vl-moe-sim",
        block_size=16,
        prefill_tokens_per_s=0.0,
        decode_tokens_per_s=0.0,
        reasoning_tokens=24,
        reasoning_jitter=4,
    ),
}
