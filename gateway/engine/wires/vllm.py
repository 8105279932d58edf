"""vLLM's OpenAI-compatible server: the body as built, ``structured_outputs.regex``, thinking via
``chat_template_kwargs``, logprobs already grammar-masked, ``vllm:prefix_cache_*`` counters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from prometheus_client.samples import Sample

from gateway.engine.wires.base import CacheProbeText, EngineWire, StartupHints
from shaping.prefix_strategy import EngineCacheConfig

CACHE_CONFIG_INFO = frozenset({"vllm:cache_config_info", "vllm:cache_config"})  # the latter: older vLLMs


class VllmWire(EngineWire):
    """vLLM: the shape the gateway builds, taken as it is."""

    kind: ClassVar[str] = "vllm"
    busy_answers: ClassVar[tuple[str, ...]] = (
        # past --max-num-queued-reqs (QueueOverflowError) and --max-num-queued-tokens
        # (MaxQueuedTokensError): vllm/exceptions.py, a 503 in the OpenAI error shape.
        "The engine is currently busy and cannot accept new requests",
        "The engine has reached its prefill token backlog limit",
    )
    probes_first_request: ClassVar[bool] = True  # its linear-attention layers' first-request fault
    cache_probe: ClassVar[CacheProbeText] = CacheProbeText("vllm:prefix_cache_hits_total / queries_total")
    hints: ClassVar[StartupHints] = StartupHints(
        served_name_flag="--served-model-name",
        grammar_fix="a vLLM with structured outputs (structured_outputs in the request body)",
        logprobs_fix="--max-logprobs {wanted}",
        logprobs_short_fix="--max-logprobs {wanted}",
        cached_tokens_fix="--enable-prompt-tokens-details",
        reasoning_fix="--reasoning-parser qwen3",
        prefix_cache_kept=None,
        publishes_slots=False,
    )

    def cache_config(self, samples: Iterable[Sample]) -> EngineCacheConfig | None:
        """``vllm:cache_config_info``'s labels: the one place vLLM's cache configuration is read."""
        said = (sample.labels for sample in samples if sample.name in CACHE_CONFIG_INFO)
        return next((EngineCacheConfig.from_labels(labels) for labels in said), None)

    def cache_counters(self, samples: Iterable[Sample]) -> tuple[float, float] | None:
        """``vllm:prefix_cache_queries_total`` and ``_hits_total`` (older: ``gpu_`` prefixed)."""
        queries = hits = None
        for sample in samples:
            if sample.name in {"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"}:
                queries = (queries or 0.0) + sample.value
            elif sample.name in {"vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"}:
                hits = (hits or 0.0) + sample.value
        return None if queries is None or hits is None else (queries, hits)
