"""Simulated engine presets: the Spark's calibration and an instant one for tests."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class SimPreset:
    """What the simulated engine is and how fast it is, before ``time_scale``."""

    name: str
    model: str
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 4096
    max_model_len: int = 131072
    block_size: int = 2960  # the hybrid model's KV block: a 1,076-token request never fills one
    kv_cache_blocks: int = 2048  # prefix-cache capacity in blocks, evicted least recently used
    # Calibrated to the Spark's three measured figures at once (bench/calibration.py): a step costs its
    # prefill tokens at 2,700 tokens/s plus one decode token per running sequence at 110 tokens/s in
    # aggregate (flat whatever the batch: an MoE). Prefill stalls the batch, so measured generation
    # (73-86 tokens/s) sits below the pure decode rate, and throughput (~47/min) barely depends on the
    # concurrency, while TTFT and end to end do: with 7 in flight (the Spark averaged 6.7), 45.9/min,
    # TTFT 0.55 s and end to end 8.7 s against the Spark's 46.7/min, 0.47 s and 8.56 s.
    prefill_tokens_per_s: float = 2700.0
    decode_tokens_per_s: float = 110.0
    step_overhead_s: float = 0.0
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

    def scaled(self, **changes: object) -> SimPreset:
        """A copy with some fields changed (from the command line)."""
        return replace(self, **changes)  # type: ignore[arg-type]


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
