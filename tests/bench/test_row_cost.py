"""``bench/row_cost.py``: a sequence's cost in a step, identified from one closed loop's token arrivals."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace
from pathlib import Path

import pytest

from bench import calibration_cpu
from bench.row_cost import (
    StreamTrace,
    clean_intervals,
    decode_spans,
    identify,
    identify_by_requests,
    load,
    save,
)
from deploy.simulator import PRESETS, SimPreset
from deploy.simulator.engine import SimScheduler
from deploy.simulator.scheduler import Sequence, TokenEvent
from deploy.simulator.tokenizer import ImageSlot, Token

ROW_S = 0.002
LAWFUL = replace(PRESETS["vllm-cpu"], step_overhead_s=0.012, prefill_tokens_per_s=9000.0,
                 decode_tokens_per_s=0.0, row_cost_s=ROW_S, request_overhead_s=0.02)  # fmt: skip
"""A stand-in engine: the law itself, with a known cost per sequence in a step."""


def lawful_traces(
    preset: SimPreset, callers: int = 4, requests: int = 40, stagger_s: float = 0.5, jitter_s: float = 0.0005
) -> list[StreamTrace]:
    """A closed loop on the law as the client sees it: each request's sending and its tokens' arrivals,
    the callers ``stagger_s`` apart, each arrival late by up to a few ``jitter_s`` (the client's reading)."""
    engine = SimScheduler(preset, time_scale=1.0)
    noise = random.Random(25)
    clock, issued = 0.0, callers
    arrivals = [(caller * stagger_s + preset.request_overhead_s, caller, caller * stagger_s) for caller in
                range(callers)]  # fmt: skip
    heapq.heapify(arrivals)
    in_engine: dict[int, tuple[Sequence, float, list[tuple[float, int]]]] = {}
    traces: list[StreamTrace] = []
    while len(traces) < requests:  # the callers stop sending after ``requests``: the last ones end alone
        while arrivals and arrivals[0][0] <= clock:
            _, index, sent = heapq.heappop(arrivals)
            output = [TokenEvent("reasoning", "x") for _ in range(64)]
            prompt: list[Token] = [ImageSlot(f"r{index}", position) for position in range(369)]
            sequence = Sequence(f"r{index}", prompt, output, max_tokens=64, arrival=sent)
            in_engine[index] = (sequence, sent, [])
            engine.submit(sequence)
        if not in_engine:
            clock = arrivals[0][0]
            continue
        step = engine.plan_step()
        clock += step.seconds
        engine.complete_step(step, clock)
        for index, (sequence, sent, seen) in list(in_engine.items()):
            if sequence.generated > (seen[-1][1] if seen else 0):
                seen.append((clock + abs(noise.gauss(0.0, jitter_s)), sequence.generated))
            if sequence.generated >= 64:
                del in_engine[index]
                traces.append(StreamTrace(sent, tuple(seen)))
                if issued < requests:
                    sent_next = clock + 0.002  # the caller's turnaround
                    heapq.heappush(arrivals, (sent_next + preset.request_overhead_s, issued, sent_next))
                    issued += 1
    return traces


def test_a_lawful_engines_cost_per_row_is_recovered_from_its_fit_configurations_step_times() -> None:
    found = identify(lawful_traces(LAWFUL))
    assert found is not None
    assert {group.rows for group in found.by_rows} == {1, 2, 3, 4}  # the staggered start's ramp
    assert found.row_s == pytest.approx(ROW_S, abs=3 * found.row_standard_error_s + 1e-4)
    assert found.row_standard_error_s < ROW_S / 4  # identified, not merely bounded
    assert found.fixed_s == pytest.approx(0.012, abs=3 * found.fixed_standard_error_s + 2e-4)


def test_a_lawful_engines_cost_per_row_is_recovered_from_its_whole_requests_too() -> None:
    found = identify_by_requests(lawful_traces(LAWFUL))
    assert found is not None
    assert found.rows_low < 2.5  # the staggered start's ramp: the first requests decode with fewer rows
    assert found.row_s == pytest.approx(ROW_S, abs=3 * found.row_standard_error_s + 1e-4)
    assert found.row_standard_error_s < ROW_S / 4
    # The fixed cost only roughly: a request's rows are averaged over its time, which weighs its prefill
    # steps by their length (the fit finds the fixed cost itself; it takes only the row's cost from here).
    assert found.fixed_s == pytest.approx(0.012, rel=0.05)


def test_an_engine_without_a_cost_per_row_is_identified_as_such() -> None:
    traces = lawful_traces(replace(LAWFUL, row_cost_s=0.0, step_overhead_s=0.02))
    for found in (identify(traces), identify_by_requests(traces)):
        assert found is not None
        assert abs(found.row_s) < 3 * found.row_standard_error_s + 1e-4


def test_a_batch_that_never_changes_identifies_nothing() -> None:
    # Streams in lockstep from start to end: one row count, so no slope.
    lockstep = [StreamTrace(0.0, tuple((0.1 + 0.01 * k, k + 1) for k in range(64))) for _ in range(12)]
    assert identify(lockstep) is None
    assert identify_by_requests(lockstep) is None


def test_the_steps_with_a_prefill_or_a_stream_changing_are_left_out() -> None:
    # One stream decodes alone (a token every 10 ms); a second is sent at 205 ms and streams from 305 to
    # 345 ms. While it waits for its first token (a prefill in the step, the API server busy), and across
    # its first and last arrivals, the first stream's intervals are not counted.
    alone = StreamTrace(0.0, tuple((0.01 * k, k) for k in range(1, 41)))
    late = StreamTrace(0.205, tuple((0.305 + 0.01 * k, k + 1) for k in range(5)))
    found = clean_intervals([alone, late])
    assert {rows: len(seen) for rows, seen in found.items()} == {1: 19 + 5, 2: 3 + 4}
    assert [seconds / tokens for seconds, tokens in found[2]] == pytest.approx([0.01] * 7)


def test_a_requests_rows_are_the_streams_decoding_beside_it_on_average() -> None:
    # One stream decodes from 0 to 1 s; a second from 0.5 to 1.5 s. The first decoded half its time alone
    # and saw the second's first token (a prefill in one of its steps); the second, half alone, saw none.
    first = StreamTrace(-0.1, tuple((k / 100, k) for k in range(101)))
    second = StreamTrace(0.4, tuple((0.5 + k / 100, k) for k in range(101)))
    assert decode_spans([first, second]) == pytest.approx([(0.01, 1.5, 1, 100), (0.01, 1.5, 0, 100)])


def test_traces_are_saved_and_read_back(tmp_path: Path) -> None:
    traces = lawful_traces(LAWFUL, requests=6)
    save(traces, tmp_path / "fit.json")
    assert load(tmp_path / "fit.json") == traces


def test_a_fit_given_the_identified_row_cost_predicts_the_batch_sizes_it_never_saw() -> None:
    # The whole path on a lawful engine: its fit configuration's step times give the row cost, the fit
    # prices what is left, and 1 and 8 in flight come out as the engine has them. Decode free, 8 in flight
    # comes out fast and 1 in flight slow (the real engine's miss).
    found = identify(lawful_traces(LAWFUL))
    assert found is not None
    measured = calibration_cpu.simulate(LAWFUL, calibration_cpu.FIT, 369, requests=40)
    with_rows = calibration_cpu.fit(measured, row_s=found.row_s, requests=40, request_s=0.02)
    free = calibration_cpu.fit(measured, requests=40, request_s=0.02)
    one, eight = (next(c for c in calibration_cpu.HELD_OUT if c.callers == n and c.thinking
                       and not c.repeated) for n in (1, 8))  # fmt: skip
    for config in (one, eight):
        real = calibration_cpu.simulate(LAWFUL, config, 369).e2e_mean_s
        assert calibration_cpu.simulate(with_rows, config, 369).e2e_mean_s == pytest.approx(real, rel=0.05)
    real_one, real_eight = (
        calibration_cpu.simulate(LAWFUL, config, 369).e2e_mean_s for config in (one, eight)
    )
    assert calibration_cpu.simulate(free, one, 369).e2e_mean_s > 1.15 * real_one
    assert calibration_cpu.simulate(free, eight, 369).e2e_mean_s < 0.9 * real_eight


def test_a_step_costs_its_fixed_cost_and_each_sequence_in_it() -> None:
    preset = replace(LAWFUL, prefill_tokens_per_s=0.0, request_overhead_s=0.0)
    engine = SimScheduler(preset, time_scale=1.0)
    for index in range(3):
        engine.submit(Sequence(f"s{index}", [ImageSlot(f"p{index}", 0)], [TokenEvent("reasoning", "x")] * 4,
                               max_tokens=4))  # fmt: skip
    step = engine.plan_step()  # three prefilling sequences: three sampled rows
    assert step.seconds == pytest.approx(0.012 + 3 * ROW_S)
    engine.complete_step(step, 0.0)
    assert engine.plan_step().seconds == pytest.approx(0.012 + 3 * ROW_S)  # three decoding


def test_a_printed_row_cost_is_read_back_with_its_measurement() -> None:
    log = (
        "  a row's cost from the step times: 0.412 ± 0.051 ms, fixed 8.10 ± 0.20 ms a step; by rows 1: ...\n"
        "measured 4 in flight, thinking on (the fit): 405.4/min, TTFT 0.029 s, end to end 0.625 s, "
        "369 prompt tokens (0 cached); load average 1.0 1.0 1.0 on 2 cores\n"
        "measured 1 in flight: 107.4/min, TTFT 0.021 s, end to end 0.559 s, 369 prompt tokens (0 cached); x\n"
    )
    (_, fitted, _), (_, held, _) = calibration_cpu.replayed(log)
    assert fitted.row_s == pytest.approx(0.000412)
    assert fitted.row_standard_error_s == pytest.approx(0.000051)
    assert held.row_s == 0.0
