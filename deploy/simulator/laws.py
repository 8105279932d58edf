"""Which engine's scheduling law the simulator runs: vLLM's (the default) or llama.cpp's server."""

from __future__ import annotations

from collections.abc import Callable

from deploy.simulator.engine import SimScheduler
from deploy.simulator.llamacpp_law import LlamaCppOptions, LlamaCppScheduler
from deploy.simulator.presets import SimPreset
from deploy.simulator.scheduler import StepLoop


def make_scheduler(
    preset: SimPreset,
    time_scale: float,
    *,
    llamacpp: LlamaCppOptions | None = None,
    observe_ttft: Callable[[float], None] | None = None,
    observe_e2e: Callable[[float], None] | None = None,
) -> StepLoop:
    """vLLM's law (``SimScheduler``), or llama.cpp's (``LlamaCppScheduler``) when its options are given."""
    if llamacpp is not None:
        return LlamaCppScheduler(preset, time_scale, llamacpp, observe_ttft, observe_e2e)
    return SimScheduler(preset, time_scale, observe_ttft, observe_e2e)
