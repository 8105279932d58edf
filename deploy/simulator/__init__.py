"""The engine simulator: vLLM's or llama-server's wire, calibrated to the Spark (see ``presets``)."""

from deploy.simulator.app import create_sim_app
from deploy.simulator.presets import PRESETS, SimPreset
from deploy.simulator.service import Faults, SimulatedEngine
from deploy.simulator.truth import FrameTruth, SimVerdict, frame_truth

__all__ = [
    "PRESETS",
    "Faults",
    "FrameTruth",
    "SimPreset",
    "SimVerdict",
    "SimulatedEngine",
    "create_sim_app",
    "frame_truth",
]
