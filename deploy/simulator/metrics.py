"""The simulated engine's `/metrics`: vLLM's metric names and labels, counters read from the scheduler."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deploy.simulator.scheduler import StepLoop


class SimMetrics:
    """vLLM's metric names, with its ``model_name`` and ``engine`` labels."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model, "engine": "0"}
        names = list(self.labels)
        buckets = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            names,
            buckets=buckets,
            registry=self.registry,
        ).labels(**self.labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            names,
            buckets=buckets,
            registry=self.registry,
        ).labels(**self.labels)

    def watch(self, engine: StepLoop) -> None:
        """Counters and gauges are read from the scheduler at scrape time."""
        labels = self.labels

        class EngineCollector(Collector):
            def collect(self) -> Iterator[Metric]:
                counters = engine.counters
                for name, doc, total in (
                    (
                        "vllm:prefix_cache_queries",
                        "Prefix cache queries, in tokens.",
                        counters.prefix_cache_queries,
                    ),
                    ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", counters.prefix_cache_hits),
                    ("vllm:prompt_tokens", "Prefill tokens processed.", counters.prompt_tokens),
                    ("vllm:generation_tokens", "Generation tokens processed.", counters.generation_tokens),
                    ("vllm:request_success", "Finished requests.", counters.requests_finished),
                ):
                    counter = CounterMetricFamily(name, doc, labels=list(labels))
                    counter.add_metric(list(labels.values()), total)
                    yield counter
                for name, doc, value in (
                    ("vllm:num_requests_running", "Requests in the running batch.", engine.num_running),
                    ("vllm:num_requests_waiting", "Requests waiting.", engine.num_waiting),
                    ("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100 %).", engine.kv_cache_usage()),
                ):
                    gauge = GaugeMetricFamily(name, doc, labels=list(labels))
                    gauge.add_metric(list(labels.values()), value)
                    yield gauge

        self.registry.register(EngineCollector())
        preset = engine.preset
        unit = preset.prefix_match_unit
        # The labels the real vLLM shows (a subset): a gateway reads the block, the match unit and the mode.
        config = {
            "block_size": str(preset.block_size),
            "cache_hit_alignment_tokens": str(unit or preset.block_size),
            "effective_attention_block_size": str(preset.block_size),
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": "True",
            "hash_block_size": "None",
            "mamba_block_size": "16" if preset.mamba_cache_mode == "align" else "None",
            "mamba_cache_mode": preset.mamba_cache_mode,
            "num_gpu_blocks": str(preset.kv_cache_blocks),
            "prefix_match_unit": "None" if unit is None else str(unit),
        }
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", labels=["engine", *config]
        )
        info.add_metric(["0", *config.values()], 1.0)
        self.registry.register(_Fixed(info))


class _Fixed(Collector):
    """A metric family that never changes (configuration info)."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterator[Metric]:
        yield self._family
