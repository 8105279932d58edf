"""The engine simulator: a vLLM-compatible server calibrated to the Spark (see ``presets``)."""

from deploy.simulator.app import Faults, SimulatedEngine, create_sim_app
from deploy.simulator.presets import PRESETS, SimPreset

__all__ = ["PRESETS", "Faults", "SimPreset", "SimulatedEngine", "create_sim_app"]
