"""A forward pass's floor on the Spark's hardware: the weights it reads, at the memory's bandwidth.

The fitted step model prices tokens only (``StepLoop._step_seconds``): a pass with few tokens costs little,
so cutting a prompt into more passes costs nothing extra. On the GB10 a pass must at least read the
weights its tokens route to from the 128 GB of unified LPDDR5x at about 273 GB/s; an MoE token's path is
its shared layers plus its experts, and a pass reads at most every weight. ``WeightReadFloor.seconds`` is
that floor, with no expert shared between two tokens until all are read (an upper bound on the bytes, so a
floor on the high side). Used by ``deploy predict`` to show what llama.cpp's extra passes would cost
(docs/simulator-llamacpp.md); the fitted presets do not include it. Defined here, with its sources, because
the vLLM model had no per-step hardware cost when this was written: once the Spark preset carries one,
that cost prices llama.cpp's passes too (``StepLoop._step_seconds``) and this floor is only the
pessimistic side.

Sources (the design notes' hardware facts): 273 GB/s; NVFP4 stores 4-bit values with an FP8 scale per 16
(about 4.5 bits a parameter), so the 125B parameters are about 70 GB and the 6B active about 3.4 GB per
token's path; the model as GGUF is 91 GB (the seed's figure), so its token path is 3.4 × 91 / 70 GB.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WeightReadFloor:
    """How many bytes a pass of ``tokens`` tokens reads, and how fast the memory gives them."""

    name: str
    total_gb: float  # every weight
    per_token_gb: float  # one token's path: shared layers and its experts
    bandwidth_gb_s: float

    def seconds(self, tokens: int) -> float:
        """The least time a forward pass over ``tokens`` tokens takes: its weight reads."""
        return min(self.total_gb, self.per_token_gb * tokens) / self.bandwidth_gb_s


GB10_BANDWIDTH_GB_S = 273.0
SPARK_NVFP4 = WeightReadFloor("NVFP4 (vLLM)", 70.0, 3.4, GB10_BANDWIDTH_GB_S)
SPARK_GGUF = WeightReadFloor(
    "GGUF, 91 GB (llama.cpp)", 91.0, 3.4 * 91.0 / 70.0, GB10_BANDWIDTH_GB_S
)
