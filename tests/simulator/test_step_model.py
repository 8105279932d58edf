"""The simulator's cost model, step by step: prefill, decode, MTP verify steps and prefill caps."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace

import httpx
import pytest

from deploy.simulator import PRESETS, SimPreset
from deploy.simulator.engine import Sequence, SimScheduler, StepPlan, TokenEvent
from deploy.simulator.tokenizer import Token
from deploy.simulator.virtual import RequestShape, alone_e2e_s, closed_loop
from tests.support import SimFactory

SPARK = PRESETS["spark"]
READS = SPARK.weight_reads
assert READS is not None  # the Spark preset prices the weights each prefill step reads


def sequence(index: int, prompt: int = 1076, output: int = 95) -> Sequence:
    tokens: list[Token] = [f"{index}:{i}" for i in range(prompt)]
    output_tokens = [TokenEvent("reasoning", "x")] * output
    return Sequence(f"s{index}", tokens, output_tokens, max_tokens=output, arrival=0.0)


def run_to_end(engine: SimScheduler, sequences: list[Sequence]) -> list[StepPlan]:
    """Submit everything, then step until every sequence has its output; answers the steps taken."""
    for s in sequences:
        engine.submit(s)
    steps, clock = [], 0.0
    while any(s.generated < len(s.output) for s in sequences):
        step = engine.plan_step()
        clock += step.seconds
        engine.complete_step(step, clock)
        steps.append(step)
        assert len(steps) < 10_000
    return steps


def test_a_step_costs_its_prefill_and_decode_tokens_at_the_presets_rates() -> None:
    engine = SimScheduler(SPARK, time_scale=1.0)
    steps = run_to_end(engine, [sequence(0, prompt=1076, output=3)])
    assert [s.prefill_tokens for s in steps] == [1076, 0, 0]
    assert steps[0].seconds == pytest.approx(READS.seconds(1076) + 1076 / SPARK.prefill_tokens_per_s)
    assert steps[1].seconds == pytest.approx(1 / SPARK.decode_tokens_per_s)


def test_a_prefill_chunk_reads_nearly_every_weight_so_chunking_costs_more_than_its_tokens() -> None:
    assert READS.chunk_bytes(1) == pytest.approx(READS.active_bytes_per_token)
    assert READS.chunk_bytes(256) > 0.999 * READS.total_weight_bytes
    assert READS.chunk_bytes(4096) <= READS.total_weight_bytes
    assert READS.seconds(1076) == pytest.approx(70.3125e9 / 273e9, rel=1e-3)  # 70 GB of NVFP4 at 273 GB/s
    whole = SimScheduler(SPARK, time_scale=1.0)
    chunked = SimScheduler(SPARK.scaled(max_num_prefill_tokens_per_step=256), time_scale=1.0)
    whole_s = sum(step.seconds for step in run_to_end(whole, [sequence(0, output=1)]))
    chunked_steps = run_to_end(chunked, [sequence(0, output=1)])
    assert len(chunked_steps) == 5  # 4 × 256 + 52
    assert sum(step.seconds for step in chunked_steps) > whole_s + 3.9 * READS.seconds(256)


def test_a_verify_step_costs_every_drafted_token_and_gains_the_accepted_share() -> None:
    preset = SPARK.scaled(num_speculative_tokens=4, draft_acceptance_rate=0.399)
    engine = SimScheduler(preset, time_scale=1.0)
    one = sequence(0, prompt=100, output=1 + 2600)
    steps = run_to_end(engine, [one])
    verify = steps[1:]
    assert all(step.seconds == pytest.approx(5 / preset.decode_tokens_per_s) for step in verify[:-1])
    # 2,600 tokens after the first at 1 + 4 × 0.399 = 2.596 a step: 1,002 verify steps (the last partial).
    assert len(verify) == math.ceil(2600 / 2.596)


def test_without_drafts_a_sequence_gains_one_token_a_step() -> None:
    engine = SimScheduler(SPARK, time_scale=1.0)
    steps = run_to_end(engine, [sequence(0, prompt=10, output=40)])
    assert len(steps) == 40


@pytest.mark.parametrize(
    ("options", "most_per_step"),
    [
        ({"max_num_prefill_tokens_per_step": 256}, 256),
        ({"max_num_batched_tokens": 512}, 512),
    ],
)
def test_prefill_chunks_never_exceed_the_cap(options: dict[str, int], most_per_step: int) -> None:
    engine = SimScheduler(SPARK.scaled(**options), time_scale=1.0)
    steps = run_to_end(engine, [sequence(i) for i in range(3)])
    assert max(step.prefill_tokens for step in steps) <= most_per_step
    assert sum(step.prefill_tokens for step in steps) == 3 * 1076  # all of it computed, in more steps


def test_the_per_sequence_threshold_caps_each_sequences_chunk() -> None:
    engine = SimScheduler(SPARK.scaled(long_prefill_token_threshold=300), time_scale=1.0)
    steps = run_to_end(engine, [sequence(i) for i in range(2)])
    assert steps[0].prefill_tokens == 600  # 300 each
    assert sum(step.prefill_tokens for step in steps) == 2 * 1076


def test_the_per_sequence_threshold_does_not_cut_a_request_that_is_alone() -> None:
    engine = SimScheduler(SPARK.scaled(long_prefill_token_threshold=300), time_scale=1.0)
    steps = run_to_end(engine, [sequence(0)])
    assert steps[0].prefill_tokens == 1076  # vLLM: nobody to starve, the whole budget


def test_parallel_prefills_limit_the_sequences_prefilling_in_a_step() -> None:
    engine = SimScheduler(SPARK.scaled(max_parallel_prefills=1), time_scale=1.0)
    steps = run_to_end(engine, [sequence(i) for i in range(3)])
    assert [len(step.prefilled_now) for step in steps[:3]] == [1, 1, 1]


def test_the_compute_share_holds_prefill_to_its_share_of_a_step_while_sequences_decode() -> None:
    preset = SPARK.scaled(prefill_compute_share=0.2)
    engine = SimScheduler(preset, time_scale=1.0)
    steps = run_to_end(engine, [sequence(i, output=200) for i in range(3)])
    assert steps[0].prefill_tokens == 3 * 1076  # nothing decodes yet: the step is all prefill
    late = SimScheduler(preset, time_scale=1.0)
    first = sequence(0, output=500)
    run_to_end(late, [])
    late.submit(first)
    for _ in range(3):
        late.complete_step(late.plan_step(), 0.0)
    late.submit(sequence(1))
    step = late.plan_step()
    prefill_s = step.prefill_tokens / preset.prefill_tokens_per_s
    assert 0 < prefill_s <= 0.2 * step.seconds + 1e-9


def test_without_chunked_prefill_a_prompt_over_the_budget_waits_for_a_step_with_room() -> None:
    preset = SPARK.scaled(enable_chunked_prefill=False, max_num_batched_tokens=1500)
    engine = SimScheduler(preset, time_scale=1.0)
    steps = run_to_end(engine, [sequence(i, output=2) for i in range(2)])
    assert [step.prefill_tokens for step in steps[:2]] == [1076, 1076]


def test_one_caller_waits_exactly_its_own_work() -> None:
    shape = RequestShape(prompt_tokens=1076, output_tokens=95, output_jitter=0)
    figures = closed_loop(SPARK, 1, shape=shape, requests=20, warmup=2)
    prefill_s = READS.seconds(1076) + 1076 / SPARK.prefill_tokens_per_s
    assert figures.ttft_mean_s == pytest.approx(prefill_s)
    work = prefill_s + 94 / SPARK.decode_tokens_per_s
    assert figures.e2e_mean_s == pytest.approx(work)


def test_the_virtual_run_is_deterministic_and_loads_the_engine_as_asked() -> None:
    first, second = closed_loop(SPARK, 7, requests=80), closed_loop(SPARK, 7, requests=80)
    assert first == second
    assert 6 < first.in_flight_mean <= 7


def test_short_requests_load_the_engine_as_asked_when_the_starts_spread_over_their_own_length() -> None:
    # The real vLLM CPU engine's thinking-off requests (372 prompt tokens, 4 out) take ~50 ms: spread over
    # the Spark's 8.56 s, four callers start 2.1 s apart and the 120 measured requests end before the
    # third one starts (bench.calibration_cpu read half the real rate from that); over their own length,
    # all four are in flight.
    cpu = replace(PRESETS["vllm-cpu"], step_overhead_s=0.0085, request_overhead_s=0.007)
    shape = RequestShape(prompt_tokens=372, output_tokens=4, output_jitter=0)
    alone = alone_e2e_s(cpu, shape)
    assert alone == pytest.approx(0.007 + 372 / cpu.prefill_tokens_per_s + 4 * (0.0085 + cpu.row_cost_s))
    spread_as_the_spark = closed_loop(cpu, 4, shape=shape, requests=120, warmup=20)
    spread_over_their_own = closed_loop(cpu, 4, shape=shape, requests=120, warmup=20, spread_s=alone)
    assert spread_as_the_spark.in_flight_mean < 2.5
    assert 3.5 < spread_over_their_own.in_flight_mean <= 4
    assert spread_over_their_own.requests_per_min > 1.3 * spread_as_the_spark.requests_per_min


def test_the_wait_for_the_step_in_progress_is_about_half_a_step_whatever_the_callers_turnaround() -> None:
    # A fixed time outside the steps locked every arrival to one phase of the 8.4 ms steps: the simulated
    # wait read 0.9 ms at a 1 ms turnaround and 8.9 ms at 2 ms, and the CPU fit's TTFT with it. Spread
    # request by request, the wait is near the half step a random phase gives, at every turnaround.
    cpu = replace(PRESETS["vllm-cpu"], step_overhead_s=0.0084, prefill_tokens_per_s=205_000,
                  request_overhead_s=0.007, row_cost_s=0.0002)  # fmt: skip
    shape = RequestShape(prompt_tokens=370, output_tokens=64, output_jitter=0)
    step_s = 0.0084 + 4 * 0.0002
    for turnaround_s in (0.0, 0.001, 0.002, 0.004, 0.006, 0.008):
        figures = closed_loop(cpu, 4, shape=shape, requests=60, warmup=20, turnaround_s=turnaround_s,
                              spread_s=alone_e2e_s(cpu, shape))  # fmt: skip
        assert 0.3 * step_s < figures.step_wait_mean_s < 0.7 * step_s, turnaround_s


def test_more_callers_never_lower_latency() -> None:
    runs = [closed_loop(SPARK, callers, requests=80) for callers in (1, 4, 8, 12)]
    e2e = [run.e2e_mean_s for run in runs]
    assert e2e == sorted(e2e)
    assert runs[-1].ttft_mean_s > runs[0].ttft_mean_s  # past 8 slots the rest queue before their prefill


def test_a_preset_without_rates_is_instant() -> None:
    instant: SimPreset = PRESETS["instant"]
    engine = SimScheduler(instant, time_scale=1.0)
    steps = run_to_end(engine, [sequence(0, prompt=50, output=5)])
    assert all(step.seconds == 0 for step in steps)


def served_chat(thinking: bool) -> dict[str, object]:
    return {
        "messages": [{"role": "system", "content": "You moderate."}, {"role": "user", "content": "check"}],
        "chat_template_kwargs": {"enable_thinking": thinking},
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_the_served_simulator_streams_every_token_when_steps_accept_drafts(start_sim: SimFactory) -> None:
    plain = start_sim("spark", time_scale=0.0)
    speculative = start_sim("spark", time_scale=0.0, num_speculative_tokens=4)
    answers = []
    for server in (plain, speculative):
        url = f"{server.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=served_chat(True), timeout=30) as response:
            lines = [line[6:] for line in response.iter_lines() if line.startswith("data: {")]
        chunks = [json.loads(line) for line in lines]
        text = "".join(
            c["choices"][0]["delta"].get("reasoning", "") + (c["choices"][0]["delta"].get("content") or "")
            for c in chunks if c["choices"]
        )
        answers.append((text, chunks[-1]["usage"]["completion_tokens"]))
    assert answers[0] == answers[1]  # the same tokens, in the same order: drafts change the pace only
    assert answers[0][1] > 60


def test_engine_sim_takes_vllm_style_flags_for_the_modelled_options() -> None:
    from deploy.predict import FlagValueError, options_from_flags

    options = options_from_flags({
        "--speculative-config": '{"method":"mtp","num_speculative_tokens":4}',
        "--max-num-prefill-tokens-per-step": "256",
        "--prefill-compute-share": "0.2",
    })
    assert options == {
        "num_speculative_tokens": 4, "max_num_prefill_tokens_per_step": 256, "prefill_compute_share": 0.2
    }
    assert SPARK.scaled(**options).num_speculative_tokens == 4
    with pytest.raises(FlagValueError, match="no option"):
        options_from_flags({"--prefill-policy": "fcfs"})


def test_a_request_overhead_outside_the_steps_adds_to_ttft_and_end_to_end_but_takes_no_step() -> None:
    shape = RequestShape(prompt_tokens=1076, output_tokens=95, output_jitter=0)
    outside = replace(SPARK, request_overhead_s=0.05)
    alone, alone_outside = (closed_loop(p, 1, shape=shape, requests=20, warmup=2) for p in (SPARK, outside))
    # each request's time outside is spread evenly over [0, 0.1 s): 20 requests' mean is within 2 ms of 0.05,
    # and a lone request's TTFT and end to end both move by exactly its own
    added = alone_outside.ttft_mean_s - alone.ttft_mean_s
    assert added == pytest.approx(0.05, abs=0.002)
    assert alone_outside.e2e_mean_s - alone.e2e_mean_s == pytest.approx(added)
    # A saturated engine keeps its pace: the API server's work runs beside the steps, not in them.
    busy, busy_outside = (closed_loop(p, 12, shape=shape, requests=80) for p in (SPARK, outside))
    assert busy_outside.requests_per_min == pytest.approx(busy.requests_per_min, rel=0.01)
    assert busy_outside.passes_per_request == pytest.approx(busy.passes_per_request, rel=0.01)


def test_the_served_engine_takes_a_request_only_after_its_overhead_outside_the_steps() -> None:
    async def first_event(overhead_s: float) -> tuple[bool, int]:
        engine = SimScheduler(replace(PRESETS["instant"], request_overhead_s=overhead_s), time_scale=1.0)
        engine.start()
        events = engine.generate(sequence(0, prompt=50, output=5))
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.05)  # the instant engine runs a request at once when it has one
        seen = engine.num_running + engine.num_waiting + engine.counters.requests_finished
        answered = first.done()
        first.cancel()
        await engine.stop()
        return answered, seen

    assert asyncio.run(first_event(0.0)) == (True, 1)
    assert asyncio.run(first_event(3600.0)) == (False, 0)  # still with the API server: not in the engine
