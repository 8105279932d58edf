"""The simulator's step model on a virtual clock: a closed-loop run in milliseconds, without sleeping.

The same ``SimScheduler.plan_step`` / ``complete_step`` the served simulator sleeps through, driven by a clock
that jumps from one step's end to the next. Callers in a closed loop each send their next request a
moment (``turnaround_s``) after an answer ends, so, as against the served simulator, a new request waits
for the step in progress. No HTTP, no tokenizer: a request is its prompt and output token counts. Runs
are deterministic, so a figure is the same on a loaded machine as on a quiet one.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

from deploy.simulator.engine import Sequence, SimScheduler, TokenEvent
from deploy.simulator.presets import SimPreset
from deploy.simulator.tokenizer import ImageSlot, Token


@dataclass(frozen=True, slots=True)
class RequestShape:
    """A request as the engine's work: prompt tokens (none cached) and output tokens, spread ± jitter."""

    prompt_tokens: int = 1076
    output_tokens: int = 95
    output_jitter: int = 10
    shared_prefix_tokens: int = (
        0  # leading prompt tokens every request repeats (what the prefix cache can reuse)
    )

    def output_for(self, index: int) -> int:
        """Output tokens of the ``index``-th request: deterministic, mean ``output_tokens``."""
        if not self.output_jitter:
            return self.output_tokens
        span = 2 * self.output_jitter + 1
        return max(1, self.output_tokens + (index * 8) % span - self.output_jitter)


SEED_SHAPE = RequestShape()
"""The seed's request: 416 system + 660 image tokens (+ the instruction) = 1,076; ~95 output (thinking on)."""


@dataclass(frozen=True, slots=True)
class LoadFigures:
    """What a closed-loop run measured, at the Spark's pace, over the requests after the warm-up."""

    callers: int
    requests: int
    requests_per_min: float
    ttft_mean_s: float
    ttft_p50_s: float
    e2e_mean_s: float
    e2e_p50_s: float
    generation_tokens_per_s: float
    in_flight_mean: float


def closed_loop(
    preset: SimPreset,
    callers: int,
    *,
    shape: RequestShape = SEED_SHAPE,
    requests: int = 240,
    warmup: int = 40,
    turnaround_s: float = 0.001,
) -> LoadFigures:
    """``callers`` callers, each sending its next request ``turnaround_s`` after an answer ends.

    Starts are staggered over one expected end to end (callers that start together stay in step and
    queue their prefills behind each other, a burst that steady traffic does not have).
    """
    if callers < 1 or requests < 2:
        raise ValueError("need at least one caller and two measured requests")
    engine = SimScheduler(preset, time_scale=1.0)
    clock = 0.0
    arrivals: list[tuple[float, int]] = []  # (time, request index)
    spacing = 8.56 / callers
    for caller in range(callers):
        heapq.heappush(arrivals, (caller * spacing, caller))
    issued = callers
    in_engine: dict[int, Sequence] = {}
    finished: list[_Finished] = []
    measured_left = requests  # callers keep sending until every measured request has ended: no drain
    while measured_left:
        while arrivals and arrivals[0][0] <= clock:
            at, index = heapq.heappop(arrivals)
            sequence = _sequence(index, shape, at)
            in_engine[index] = sequence
            engine.submit(sequence)
        if not in_engine:
            clock = arrivals[0][0]
            continue
        step = engine.plan_step()
        if not step.decoding and not step.prefill_tokens:  # nothing can run until a caller sends more
            if not arrivals:
                raise RuntimeError("the engine cannot schedule the requests it holds")
            clock = max(clock, arrivals[0][0])
            continue
        clock += step.seconds
        engine.complete_step(step, clock)
        for index, sequence in list(in_engine.items()):
            if sequence.generated < len(sequence.output):
                continue
            del in_engine[index]
            first = sequence.first_token_at if sequence.first_token_at is not None else clock
            finished.append(_Finished(index, sequence.arrival, first, clock, sequence.generated))
            measured_left -= warmup <= index < warmup + requests
            heapq.heappush(arrivals, (clock + turnaround_s, issued))
            issued += 1
    return _figures(callers, finished, warmup, requests)


@dataclass(frozen=True, slots=True)
class _Finished:
    index: int
    arrival: float
    first_token: float
    end: float
    output_tokens: int


def _sequence(index: int, shape: RequestShape, arrival: float) -> Sequence:
    # Distinct prompt tokens per request past the shared prefix: by default nothing is cached, as on the
    # Spark (a 1,076-token prompt never fills one 2,960-token block).
    shared = min(shape.shared_prefix_tokens, shape.prompt_tokens)
    prompt: list[Token] = [ImageSlot("shared", position) for position in range(shared)]
    prompt += [ImageSlot(f"r{index}", position) for position in range(shared, shape.prompt_tokens)]
    output = [TokenEvent("reasoning", "x") for _ in range(shape.output_for(index))]
    return Sequence(
        request_id=f"virtual-{index}",
        prompt=prompt,
        output=output,
        max_tokens=len(output),
        arrival=arrival,
    )


def _figures(callers: int, finished: list[_Finished], warmup: int, requests: int) -> LoadFigures:
    """Latencies over the measured requests; rates over every request that ended while they ran."""
    measured = [row for row in finished if warmup <= row.index < warmup + requests]
    start = min(row.arrival for row in measured)
    end = max(row.end for row in measured)
    window = [row for row in finished if start < row.end <= end]
    span = end - start
    ttft = [row.first_token - row.arrival for row in measured]
    e2e = [row.end - row.arrival for row in measured]
    # Time in flight of every request, clipped to the window: the mean number in flight (Little's L).
    busy = sum(max(0.0, min(row.end, end) - max(row.arrival, start)) for row in finished)
    return LoadFigures(
        callers=callers,
        requests=len(measured),
        requests_per_min=len(window) / span * 60,
        ttft_mean_s=statistics.fmean(ttft),
        ttft_p50_s=statistics.median(ttft),
        e2e_mean_s=statistics.fmean(e2e),
        e2e_p50_s=statistics.median(e2e),
        generation_tokens_per_s=sum(row.output_tokens for row in window) / span,
        in_flight_mean=busy / span,
    )
