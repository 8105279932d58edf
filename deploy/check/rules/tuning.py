"""Rules on departures from the Spark's measured tuning: speculative decoding and prefill knobs."""

from __future__ import annotations

from collections.abc import Iterator

from deploy.check.compose import Deployment
from deploy.check.model import Finding

_PREFILL_KNOBS = (
    "--long-prefill-token-threshold",
    "--max-num-partial-prefills",
    "--max-long-partial-prefills",
    "--enable-chunked-prefill",  # only its --no- form: turning on the default changes nothing
)
# The Spark's vLLM fork's prefill-balancing flags. Measured on the Spark with them (three rounds): 24.3, 34.7
# and 30.7 requests/min, against 46.7 without any.
_FORK_PREFILL_KNOBS = (
    "--prefill-compute-share",
    "--prefill-compute-half-life",
    "--max-num-prefill-tokens-per-step",
    "--max-parallel-prefills",
    "--prefill-policy",
    "--decode-refill-target",
)
_RATE_WITHOUT_FORK_KNOBS = 46.7  # requests/min, the tuned Spark
_RATES_WITH_FORK_KNOBS = (24.3, 34.7, 30.7)  # requests/min, three measured rounds
_BUSINESS_MINIMUM = 45  # keyframes a minute


def speculative_decoding(deployment: Deployment) -> Iterator[Finding]:
    """speculative-decoding: any `--speculative-*` flag or `--num-speculative-tokens` (MTP included)."""
    for engine in deployment.engines:
        for flag in engine.flags:
            if not (flag.key.startswith("--speculative") or flag.key == "--num-speculative-tokens"):
                continue
            mtp = " (MTP)" if "mtp" in (flag.value or "").lower() else ""
            yield Finding(
                "error",
                "speculative-decoding",
                f"`{flag.name}` turns on speculative decoding{mtp}: on this workload MTP accepted 1.6 of 4 "
                "drafted tokens and made everything slower (and vLLM refuses it in Mamba cache mode 'align', "
                "which hybrid models use with prefix caching)",
                flag.arg.location,
            )


def prefill_scheduling(deployment: Deployment) -> Iterator[Finding]:
    """prefill-scheduling: vLLM's prefill-scheduling knobs, none of which the tuned engine uses."""
    for engine in deployment.engines:
        for flag in engine.flags:
            if flag.key not in _PREFILL_KNOBS:
                continue
            if flag.key == "--enable-chunked-prefill" and not flag.negated:
                continue  # turning on what is already the default changes nothing
            yield Finding(
                "warning",
                "prefill-scheduling",
                f"`{flag.name}` is a prefill-scheduling knob: the tuned Spark engine uses none (prefill is "
                "most of its token work, and the first token is what callers wait on)",
                flag.arg.location,
            )


def prefill_balancing(deployment: Deployment) -> Iterator[Finding]:
    """prefill-balancing: the Spark vLLM fork's six prefill-balancing knobs, measured slower."""
    *earlier, last = _RATES_WITH_FORK_KNOBS
    rounds = f"{', '.join(map(str, earlier))} and {last}"
    for engine in deployment.engines:
        for flag in engine.flags:
            if flag.key not in _FORK_PREFILL_KNOBS:
                continue
            yield Finding(
                "warning",
                "prefill-balancing",
                f"`{flag.name}` is one of the Spark vLLM fork's six prefill-balancing knobs: with them "
                f"the Spark served {rounds} requests/min in three measured rounds, against "
                f"{_RATE_WITHOUT_FORK_KNOBS} without, below the {_BUSINESS_MINIMUM} keyframes/min the "
                "business needs: the tuned engine sets none",
                flag.arg.location,
            )
