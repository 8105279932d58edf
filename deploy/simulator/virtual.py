"""The simulator's step model on a virtual clock: a closed-loop run in milliseconds, without sleeping.

The same ``SimScheduler.plan_step`` / ``complete_step`` the served simulator sleeps through, driven by a clock
that jumps from one step's end to the next. Callers in a closed loop each send their next request a
moment (``turnaround_s``) after an answer ends, so, as against the served simulator, a new request waits
for the step in progress. No HTTP, no tokenizer: a request is its prompt and output token counts. Runs
are deterministic, so a figure is the same on a loaded machine as on a quiet one.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from deploy.simulator.engine import Sequence, SimScheduler, TokenEvent
from deploy.simulator.llamacpp_law import user_header
from deploy.simulator.presets import SimPreset
from deploy.simulator.scheduler import StepLoop
from deploy.simulator.tokenizer import ImageSlot, Token


@dataclass(frozen=True, slots=True)
class RequestShape:
    """A request as the engine's work: prompt tokens and output tokens, spread ± jitter.

    With ``image_tokens`` the prompt is laid out as the chat template lays out a keyframe request: a
    system message of ``shared_prefix_tokens`` (the same in every request), then a user message (its
    header, one image of its own, the instruction and the assistant header). Without, the prompt is the
    shared prefix, then tokens of the request's own.
    """

    prompt_tokens: int = 1076
    output_tokens: int = 95
    output_jitter: int = 10
    shared_prefix_tokens: int = (
        0  # leading prompt tokens every request repeats (what the prefix cache can reuse)
    )
    image_tokens: int = 0

    def output_for(self, index: int) -> int:
        """Output tokens of the ``index``-th request: deterministic, mean ``output_tokens``."""
        if not self.output_jitter:
            return self.output_tokens
        span = 2 * self.output_jitter + 1
        return max(1, self.output_tokens + (index * 8) % span - self.output_jitter)


SEED_SHAPE = RequestShape(shared_prefix_tokens=416, image_tokens=640)
"""The seed's request: 1,076 prompt tokens, ~95 output (thinking on).

Laid out as the template does: the 416-token system prompt, the user header (3), the image, then the
instruction and the assistant header (17); the image is 640 of the seed's "660" so the total stays
1,076 (the seed rounded 416 + 660). vLLM's law reuses none of it (no full 2,960-token block).
"""
THINKING_OFF_SHAPE = RequestShape(
    output_tokens=3, output_jitter=1, shared_prefix_tokens=416, image_tokens=640
)
"""The seed's request with thinking off and the compact verdict: 2-6 output tokens (3 on average)."""


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
    passes_per_request: float = 0.0  # forward passes the engine ran, over the whole run, per finished request
    # Mean time a measured request, once at the engine, waited for the step in progress to end (the engine
    # takes new requests between steps, as vLLM's engine core does).
    step_wait_mean_s: float = 0.0


def alone_e2e_s(preset: SimPreset, shape: RequestShape) -> float:
    """A request's end to end alone on the engine, from the preset's constants: its time outside the
    steps, its prefill, and a step (fixed cost, its row, its decode token) per output token."""
    decode_s = 1 / preset.decode_tokens_per_s if preset.decode_tokens_per_s > 0 else 0.0
    step_s = preset.step_overhead_s + preset.row_cost_s + decode_s
    prefill_s = shape.prompt_tokens / preset.prefill_tokens_per_s
    return preset.request_overhead_s + prefill_s + shape.output_tokens * step_s


def closed_loop(
    preset: SimPreset,
    callers: int,
    *,
    shape: RequestShape = SEED_SHAPE,
    requests: int = 240,
    warmup: int = 40,
    turnaround_s: float = 0.001,
    law: Callable[[SimPreset], StepLoop] | None = None,
    spread_s: float = 8.56,
) -> LoadFigures:
    """``callers`` callers, each sending its next request ``turnaround_s`` after an answer ends.

    Starts are staggered over one expected end to end, ``spread_s`` (callers that start together stay in
    step and queue their prefills behind each other, a burst that steady traffic does not have): by
    default the seed's measured 8.56 s; an engine whose requests take far less must say its own
    (:func:`alone_e2e_s`), or its callers start seconds apart and the warm-up ends before they all run.
    ``law`` builds the engine's scheduler from the preset (default: vLLM's, ``SimScheduler``). A request
    reaches the engine the preset's ``request_overhead_s`` after it was sent (the API server's work
    outside the steps); its TTFT and end to end count from the send. That time is spread evenly over 0 to
    twice the preset's mean, request by request (:func:`_outside_s`): a fixed one would lock every
    arrival to one phase of the steps, and the wait for the step in progress would be whatever that phase
    gives (1 to 9 ms of an 8 ms step on the CPU preset, by the turnaround alone) instead of its mean.
    """
    if callers < 1 or requests < 2:
        raise ValueError("need at least one caller and two measured requests")
    engine = law(preset) if law is not None else SimScheduler(preset, time_scale=1.0)
    clock = 0.0
    arrivals: list[tuple[float, int, float]] = []  # (at the engine, request index, sent)
    spacing = spread_s / callers
    outside = preset.request_overhead_s  # on average a request is at the engine this long after it was sent
    for caller in range(callers):
        heapq.heappush(arrivals, (caller * spacing + _outside_s(outside, caller), caller, caller * spacing))
    issued = callers
    in_engine: dict[int, Sequence] = {}
    waits: dict[int, float] = {}
    finished: list[_Finished] = []
    passes = 0
    measured_left = requests  # callers keep sending until every measured request has ended: no drain
    while measured_left:
        while arrivals and arrivals[0][0] <= clock:
            at, index, sent = heapq.heappop(arrivals)
            sequence = _sequence(index, shape, sent)  # arrival: when the caller sent it
            waits[index] = clock - at  # the engine takes it at the end of the step in progress
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
        passes += step.passes
        engine.complete_step(step, clock)
        for index, sequence in list(in_engine.items()):
            if sequence.generated < len(sequence.output):
                continue
            del in_engine[index]
            first = sequence.first_token_at if sequence.first_token_at is not None else clock
            finished.append(_Finished(index, sequence.arrival, first, clock, sequence.generated))
            measured_left -= warmup <= index < warmup + requests
            sent = clock + turnaround_s
            heapq.heappush(arrivals, (sent + _outside_s(outside, issued), issued, sent))
            issued += 1
    figures = _figures(callers, finished, warmup, requests)
    measured_waits = [waits[row.index] for row in finished if warmup <= row.index < warmup + requests]
    return replace(
        figures, passes_per_request=passes / len(finished), step_wait_mean_s=statistics.fmean(measured_waits)
    )


_GOLDEN = (math.sqrt(5) - 1) / 2  # Weyl's sequence: index * this, mod 1, fills [0, 1) evenly


def _outside_s(mean_s: float, index: int) -> float:
    """The ``index``-th request's time outside the steps: deterministic, spread evenly over [0, 2 mean)."""
    return 2 * mean_s * ((index * _GOLDEN) % 1.0)


@dataclass(frozen=True, slots=True)
class _Finished:
    index: int
    arrival: float
    first_token: float
    end: float
    output_tokens: int


def _prompt(index: int, shape: RequestShape) -> list[Token]:
    if not shape.image_tokens:
        # Distinct prompt tokens per request past the shared prefix: by default nothing is cached, as on
        # the Spark (a 1,076-token prompt never fills one 2,960-token block).
        shared = min(shape.shared_prefix_tokens, shape.prompt_tokens)
        prompt: list[Token] = [ImageSlot("shared", position) for position in range(shared)]
        return prompt + [ImageSlot(f"r{index}", position) for position in range(shared, shape.prompt_tokens)]
    header = list(user_header())  # the template's own tokens mark where the user message starts
    # Stand-in text tokens: ids past the vocabulary, the same in every request (system) or after the image.
    system: list[Token] = [_TEXT + i for i in range(shape.shared_prefix_tokens)]
    image: list[Token] = [ImageSlot(f"frame-{index}", i) for i in range(shape.image_tokens)]
    tail = max(0, shape.prompt_tokens - len(system) - len(header) - len(image))
    return [*system, *header, *image, *(_TEXT + len(system) + i for i in range(tail))]


_TEXT = 1_000_000  # no vocabulary reaches it


def _sequence(index: int, shape: RequestShape, arrival: float) -> Sequence:
    prompt = _prompt(index, shape)
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
