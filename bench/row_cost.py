"""A sequence's cost in a step, identified from one closed loop's token arrival times.

The step law's fixed cost and its cost per sequence (``SimPreset.row_cost_s``) cannot be told apart by a
run whose batch is always the same size. Inside the fit configuration's own run it is not: the callers
start apart (the warm-up ramps 1, 2, 3, 4 streams), the last requests finish one by one, and between a
request's last token and its successor's first the others decode without it. The client sees every
streamed token arrive, so it knows, for each request, how long its decode took (first token to last) and
how many streams were decoding beside it on average over that time.

Each request is one observation: its decode time per token against the mean rows it decoded with and the
other requests' prefills that fell inside it (each a step with a prompt in it), by least squares:
``per-token time = fixed + rows * row_s + (prefills / tokens) * prefill_s``. Whole requests, not single
token intervals: on a loaded machine the API server sends tokens late and then in bursts (8 tokens in one
chunk was seen at load 10), which scatter an interval but move a request's ends by one burst at most.
Requests overlap, so their errors are not independent and the standard errors are a lower bound
(docs/engineering.md: how well a run identified it). A run's traces are kept as JSON (:func:`save`,
:func:`load`) so they can be read again.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_INTERVALS = 8  # a row count with fewer clean intervals says nothing
MIN_REQUESTS = 8  # fewer decoded requests than this say nothing


@dataclass(frozen=True, slots=True)
class StreamTrace:
    """One streamed request as the client saw it: when it was sent, and each chunk's arrival with the
    completion tokens counted up to it (cumulative)."""

    sent: float
    arrivals: tuple[tuple[float, int], ...]

    @property
    def first(self) -> float:
        """When its first token arrived (its prefill's step ended)."""
        return self.arrivals[0][0] if self.arrivals else math.inf

    @property
    def last(self) -> float:
        """When its last token arrived."""
        return self.arrivals[-1][0] if self.arrivals else -math.inf


@dataclass(frozen=True, slots=True)
class StepTimes:
    """The steps at one row count: their mean time, its standard error, and how many were seen."""

    rows: int
    mean_s: float
    standard_error_s: float
    intervals: int  # clean intervals, over every stream
    steps: float  # tokens / rows: each step is seen once by each of its rows


@dataclass(frozen=True, slots=True)
class RowCost:
    """The step time against its rows: ``fixed_s + rows * row_s``, each with its standard error."""

    row_s: float
    row_standard_error_s: float
    fixed_s: float
    fixed_standard_error_s: float
    by_rows: tuple[StepTimes, ...]

    def describe(self) -> str:
        """One line, as the calibration run prints it (and ``calibration_cpu.replayed`` reads it back)."""
        groups = ", ".join(
            f"{group.rows}: {group.mean_s * 1000:.2f} ± {group.standard_error_s * 1000:.2f} ms "
            f"({group.steps:.0f} steps)"
            for group in self.by_rows
        )
        return (f"a row's cost from the step times: {self.row_s * 1000:.3f} ± "
                f"{self.row_standard_error_s * 1000:.3f} ms, fixed {self.fixed_s * 1000:.2f} ± "
                f"{self.fixed_standard_error_s * 1000:.2f} ms a step; by rows {groups}")  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestFit:
    """A decode step's time against its rows: ``fixed_s + rows * row_s`` (plus ``prefill_s`` for a step
    that also holds another request's prompt), each with its standard error, over ``requests``."""

    row_s: float
    row_standard_error_s: float
    fixed_s: float
    fixed_standard_error_s: float
    prefill_s: float
    requests: int
    rows_low: float  # the least and the most rows a request decoded with, on average over its decode
    rows_high: float

    def describe(self) -> str:
        """One line, as the calibration run prints it beside :meth:`RowCost.describe`'s."""
        return (f"a row's cost from whole requests: {self.row_s * 1000:.3f} ± "
                f"{self.row_standard_error_s * 1000:.3f} ms, fixed {self.fixed_s * 1000:.2f} ± "
                f"{self.fixed_standard_error_s * 1000:.2f} ms a step, a prefill "
                f"{self.prefill_s * 1000:.1f} ms; {self.requests} requests decoding with "
                f"{self.rows_low:.2f} to {self.rows_high:.2f} rows")  # fmt: skip


def save(traces: Sequence[StreamTrace], path: Path) -> None:
    """A run's traces as JSON: one object per request, its sending and its arrivals."""
    path.write_text(json.dumps([{"sent": t.sent, "arrivals": t.arrivals} for t in traces]))


def load(path: Path) -> list[StreamTrace]:
    """Traces saved by :func:`save`."""
    return [StreamTrace(float(row["sent"]), tuple((float(at), int(tokens)) for at, tokens in row["arrivals"]))
            for row in json.loads(path.read_text())]  # fmt: skip


def clean_intervals(traces: Sequence[StreamTrace]) -> dict[int, list[tuple[float, int]]]:
    """Each stream's intervals between two arrivals (seconds, tokens brought) whose steps held a known,
    constant set of decoding rows and no prefill, grouped by that row count."""
    grouped: dict[int, list[tuple[float, int]]] = {}
    for trace in traces:
        for (began, before), (ended, after) in zip(trace.arrivals, trace.arrivals[1:], strict=False):
            tokens = after - before
            if tokens <= 0 or ended <= began:
                continue
            rows = 0
            for other in traces:
                if other.sent < ended and other.first > began:
                    break  # sent and not yet at its first token: a prefill or the API server's work
                if began < other.first < ended or began < other.last < ended:
                    break  # a stream starting or ending inside: the rows changed
                rows += other.first <= began and other.last >= ended
            else:
                grouped.setdefault(rows, []).append((ended - began, tokens))
    return grouped


def identify(traces: Sequence[StreamTrace]) -> RowCost | None:
    """The step's cost per row and its fixed cost from a run's clean intervals (:func:`clean_intervals`);
    None when fewer than two row counts have :data:`MIN_INTERVALS` of them (nothing varied)."""
    groups: list[StepTimes] = []
    for rows, seen in sorted(clean_intervals(traces).items()):
        if len(seen) < MIN_INTERVALS:
            continue
        tokens = sum(count for _, count in seen)
        mean = sum(seconds for seconds, _ in seen) / tokens
        steps = tokens / rows
        # Its standard error: the per-token intervals' spread over the steps behind them (a step's rows see
        # the same step, so they are not independent draws).
        spread = statistics.stdev(seconds / count for seconds, count in seen)
        groups.append(StepTimes(rows, mean, spread / math.sqrt(max(steps, 1.0)), len(seen), steps))
    if len(groups) < 2:
        return None
    # Weighted least squares through the groups' means, each weighted by its steps (a step once).
    weights = [group.steps for group in groups]
    total = sum(weights)
    mean_rows = sum(w * g.rows for w, g in zip(weights, groups, strict=True)) / total
    mean_s = sum(w * g.mean_s for w, g in zip(weights, groups, strict=True)) / total
    spread_rows = sum(w * (g.rows - mean_rows) ** 2 for w, g in zip(weights, groups, strict=True))
    slope = sum(w * (g.rows - mean_rows) * (g.mean_s - mean_s) for w, g in zip(weights, groups, strict=True))
    slope /= spread_rows
    intercept = mean_s - slope * mean_rows
    # Standard errors from the groups' own standard errors (the means are independent across row counts).
    slope_variance = sum(
        (w * (g.rows - mean_rows) / spread_rows) ** 2 * g.standard_error_s**2
        for w, g in zip(weights, groups, strict=True)
    )
    intercept_variance = sum(
        (w / total - mean_rows * w * (g.rows - mean_rows) / spread_rows) ** 2 * g.standard_error_s**2
        for w, g in zip(weights, groups, strict=True)
    )
    return RowCost(slope, math.sqrt(slope_variance), intercept, math.sqrt(intercept_variance), tuple(groups))


def decode_spans(traces: Sequence[StreamTrace]) -> list[tuple[float, float, int, int]]:
    """Each request that decoded: (its decode time per token, the mean rows decoding over it, the other
    requests' first tokens inside it, its decode tokens)."""
    spans = [(t.first, t.last) for t in traces if len(t.arrivals) > 1]
    edges = sorted({edge for span in spans for edge in span})
    # The rows decoding between two consecutive edges (first or last arrivals of any request).
    rows_between = [sum(first <= left and last >= right for first, last in spans)
                    for left, right in itertools.pairwise(edges)]  # fmt: skip
    seen: list[tuple[float, float, int, int]] = []
    for trace in traces:
        if len(trace.arrivals) < 2 or trace.last <= trace.first:
            continue
        tokens = trace.arrivals[-1][1] - trace.arrivals[0][1]
        if tokens <= 0:
            continue
        busy = sum(
            rows * (right - left)
            for rows, left, right in zip(rows_between, edges, edges[1:], strict=False)
            if trace.first <= left and right <= trace.last
        )
        span = trace.last - trace.first
        prefills = sum(trace.first < other.first <= trace.last for other in traces if other is not trace)
        seen.append((span / tokens, busy / span, prefills, tokens))
    return seen


def identify_by_requests(traces: Sequence[StreamTrace]) -> RequestFit | None:
    """The decode step's cost per row and its fixed cost from a run's traces, by least squares over its
    requests; None when fewer than :data:`MIN_REQUESTS` decoded or their rows never varied."""
    seen = decode_spans(traces)
    if len(seen) < MIN_REQUESTS:
        return None
    # per-token time = fixed + rows * row + (prefills / tokens) * prefill
    design = [(1.0, rows, prefills / tokens) for _, rows, prefills, tokens in seen]
    answers = [per_token for per_token, _, _, _ in seen]
    normal = [[sum(x[i] * x[j] for x in design) for j in range(3)] for i in range(3)]
    inverse = _inverse(normal)
    if inverse is None:
        return None
    moments = [sum(x[i] * y for x, y in zip(design, answers, strict=True)) for i in range(3)]
    fixed, row, prefill = (sum(inverse[i][j] * moments[j] for j in range(3)) for i in range(3))
    residuals = [y - (fixed + row * x[1] + prefill * x[2]) for x, y in zip(design, answers, strict=True)]
    variance = sum(r * r for r in residuals) / max(1, len(seen) - 3)
    rows = [x[1] for x in design]
    return RequestFit(row, math.sqrt(variance * inverse[1][1]), fixed, math.sqrt(variance * inverse[0][0]),
                   prefill, len(seen), min(rows), max(rows))  # fmt: skip


def _inverse(matrix: list[list[float]]) -> list[list[float]] | None:
    """A 3 x 3 matrix's inverse by its adjugate; None when it is (nearly) singular."""
    (a, b, c), (d, e, f), (g, h, i) = matrix
    cofactors = [[e * i - f * h, c * h - b * i, b * f - c * e],
                 [f * g - d * i, a * i - c * g, c * d - a * f],
                 [d * h - e * g, b * g - a * h, a * e - b * d]]  # fmt: skip
    determinant = a * cofactors[0][0] + b * cofactors[1][0] + c * cofactors[2][0]
    scale = max(abs(value) for row in matrix for value in row)
    if abs(determinant) <= 1e-12 * scale**3:
        return None
    return [[value / determinant for value in row] for row in cofactors]
