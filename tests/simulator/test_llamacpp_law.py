"""llama.cpp's server law (deploy/simulator/llamacpp_law.py): slot choice, prompt reuse, batches, passes."""

from __future__ import annotations

import pytest

from deploy.simulator import PRESETS
from deploy.simulator.llamacpp_law import (
    BatchEntry,
    ContextSizeExceededError,
    LlamaCppOptions,
    LlamaCppScheduler,
    micro_batches,
    user_header,
)
from deploy.simulator.scheduler import FinishEvent, Sequence, StepPlan, TokenEvent
from deploy.simulator.tokenizer import ImageSlot, Token, render_chat
from deploy.simulator.virtual import SEED_SHAPE, THINKING_OFF_SHAPE, closed_loop

SPARK = PRESETS["spark"]
SYSTEM = "你是视频内容审核员。" * 20  # the same in every request
INSTRUCTION = "请审核这张视频关键帧截图。"
ATTENTION_ONLY = LlamaCppOptions(n_parallel=2, n_ctx=16384, recurrent=False)
HYBRID = LlamaCppOptions(n_parallel=2, n_ctx=16384)


def keyframe_prompt(frame: str, image_tokens: int = 64, system: str = SYSTEM) -> list[Token]:
    image: list[ImageSlot | str] = [ImageSlot(frame, i) for i in range(image_tokens)]
    return render_chat([("system", [system]), ("user", [*image, INSTRUCTION])], enable_thinking=False)


def request(frame: str, output: int = 3, **kwargs: object) -> Sequence:
    prompt = keyframe_prompt(frame, **kwargs)  # type: ignore[arg-type]  # test helper: image_tokens, system
    return Sequence(frame, prompt, [TokenEvent("content", "x")] * output, max_tokens=output, arrival=0.0)


def run(engine: LlamaCppScheduler, *sequences: Sequence) -> list[StepPlan]:
    """Submit, then step until every sequence has its output; answers the steps."""
    for sequence in sequences:
        engine.submit(sequence)
    steps, clock = [], 0.0
    while any(s.generated < len(s.output) for s in sequences):
        step = engine.plan_step()
        clock += step.seconds
        engine.complete_step(step, clock)
        steps.append(step)
        assert len(steps) < 1000
    return steps


def shared_prefix(prompt: list[Token]) -> int:
    """Tokens before the image: the system message and the user message's header."""
    return next(i for i, token in enumerate(prompt) if isinstance(token, ImageSlot))


def user_start(prompt: list[Token]) -> int:
    header = list(user_header())
    return next(i for i in range(len(prompt)) if prompt[i : i + len(header)] == header)


def test_an_attention_only_model_reuses_the_whole_common_prefix_on_the_same_slot() -> None:
    engine = LlamaCppScheduler(SPARK, 1.0, ATTENTION_ONLY)
    first, second = request("a"), request("b")
    run(engine, first)
    run(engine, second)
    assert first.cached == 0
    assert second.cached == shared_prefix(second.prompt)  # token by token, up to the new image


def test_a_hybrid_model_reuses_the_prefix_only_up_to_the_checkpoint_at_the_user_message() -> None:
    engine = LlamaCppScheduler(SPARK, 1.0, HYBRID)
    first, second = request("a"), request("b")
    run(engine, first)
    run(engine, second)
    # The recurrent state sits at the end of the last request; the checkpoint saved before the user message
    # is the newest one at or before the common prefix: the system message is reused, the user header not.
    assert second.cached == user_start(second.prompt)
    assert engine.checkpoints_restored == 1


def test_a_hybrid_model_without_checkpoints_computes_every_prompt_again() -> None:
    engine = LlamaCppScheduler(SPARK, 1.0, LlamaCppOptions(n_parallel=2, n_ctx=16384, n_ctx_checkpoints=0))
    run(engine, request("a"))
    second = request("b")
    run(engine, second)
    assert second.cached == 0
    assert engine.full_reprocessing == 1


def test_without_cache_prompt_nothing_is_reused() -> None:
    options = LlamaCppOptions(n_parallel=2, n_ctx=16384, recurrent=False, cache_prompt=False)
    engine = LlamaCppScheduler(SPARK, 1.0, options)
    run(engine, request("a"))
    second = request("b")
    run(engine, second)
    assert second.cached == 0


def test_a_request_takes_the_idle_slot_that_shares_its_prefix_not_the_least_recently_used() -> None:
    engine = LlamaCppScheduler(SPARK, 1.0, LlamaCppOptions(n_parallel=2, n_ctx=16384, recurrent=False))
    run(engine, request("a", system="审核规则甲。" * 40))  # slot 1 (every slot empty: the last one)
    run(engine, request("b", system="完全不同的提示。" * 40))  # slot 0, least recently used
    third = request("c", system="审核规则甲。" * 40)
    engine.submit(third)
    engine.plan_step()
    assert engine.slot_of(third) is engine.slots[1]
    assert third.cached == shared_prefix(third.prompt)


def test_without_a_similar_slot_the_least_recently_used_idle_slot_is_taken() -> None:
    options = LlamaCppOptions(n_parallel=2, n_ctx=16384, slot_prompt_similarity=0)
    engine = LlamaCppScheduler(SPARK, 1.0, options)
    run(engine, request("a"))  # slot 1
    second = request("b")
    engine.submit(second)
    engine.plan_step()
    assert engine.slot_of(second) is engine.slots[0]  # never used: older than slot 1
    assert second.cached == 0


def test_an_image_is_decoded_on_its_own_in_micro_batches_before_the_batch() -> None:
    compute_only = SPARK.scaled(weight_reads=None)  # the passes' tokens at the rate, nothing per pass
    engine = LlamaCppScheduler(compute_only, 1.0, LlamaCppOptions(n_parallel=1, n_ctx=16384, recurrent=False))
    steps = run(engine, request("a", image_tokens=640, output=2))
    prompt_steps = [step for step in steps if step.prefill_tokens]
    # Text up to the image (a pass), the image alone (512 + 128), then the text after it (a pass).
    assert len(prompt_steps) == 2
    assert prompt_steps[1].passes == 3
    image_and_tail = prompt_steps[1].prefill_tokens
    assert prompt_steps[1].seconds == pytest.approx(image_and_tail / SPARK.prefill_tokens_per_s)


def test_generated_tokens_and_a_prompt_share_one_batch_and_one_pass_with_unified_attention() -> None:
    options = LlamaCppOptions(n_parallel=2, n_ctx=16384, recurrent=False, kv_unified=True)
    engine = LlamaCppScheduler(SPARK, 1.0, options)
    long_running = request("a", output=50)
    engine.submit(long_running)
    for _ in range(5):
        engine.complete_step(engine.plan_step(), 0.0)
    assert long_running.prefill_done
    text_only = Sequence("t", [*user_header(), *range(1000, 1040)],
                         [TokenEvent("content", "x")], max_tokens=1, arrival=0.0)
    engine.submit(text_only)
    step = engine.plan_step()
    assert step.decoding == [long_running]
    assert step.prefill_tokens == len(text_only.prompt)
    assert step.passes == 1  # one batch, one micro-batch: prefill and decode mixed
    assert SPARK.weight_reads is not None  # one pass: its tokens, and the weights its prompt tokens read
    expected = len(text_only.prompt) / SPARK.prefill_tokens_per_s + 1 / SPARK.decode_tokens_per_s
    assert step.seconds == pytest.approx(expected + SPARK.weight_reads.seconds(len(text_only.prompt)))


def test_with_recurrent_layers_the_batch_splits_equally_so_decode_and_prompt_take_separate_passes() -> None:
    entries = [BatchEntry(0, 1, False), BatchEntry(1, 1, False), BatchEntry(2, 300, True)]
    assert micro_batches(entries, 512, equal=True, sequential=True) == [(1, 2), (299, 0)]
    assert micro_batches(entries, 512, equal=False, sequential=False) == [(300, 2)]


def test_a_sequential_equal_split_takes_consecutive_slots_only() -> None:
    entries = [BatchEntry(0, 1, False), BatchEntry(1, 1, False), BatchEntry(3, 1, False),
               BatchEntry(2, 100, True)]
    # Slots 0, 1, then 2 (its prompt; 3 is not next to 1): one token each; then 3's token; then 2's rest.
    assert micro_batches(entries, 512, equal=True, sequential=True) == [(1, 2), (0, 1), (99, 0)]
    assert micro_batches([BatchEntry(0, 1200, True)], 512, equal=True, sequential=True) == [
        (512, 0), (512, 0), (176, 0)]


def test_the_context_is_split_among_the_slots_and_a_prompt_over_its_share_is_refused() -> None:
    options = LlamaCppOptions(n_parallel=8, n_ctx=8192)
    assert options.n_ctx_slot(131072) == 1024
    engine = LlamaCppScheduler(SPARK, 1.0, options)
    too_long = request("a", image_tokens=1000)
    with pytest.raises(ContextSizeExceededError, match=r"exceeds the available context size \(1024 tokens\)"):
        engine.submit(too_long)
    assert LlamaCppOptions(n_parallel=8, n_ctx=8192, kv_unified=True).n_ctx_slot(131072) == 8192


def test_with_a_unified_cache_idle_slots_are_cleared_and_reuse_comes_back_from_host_memory() -> None:
    options = LlamaCppOptions(n_parallel=2, n_ctx=16384, kv_unified=True)
    engine = LlamaCppScheduler(SPARK, 1.0, options)
    run(engine, request("a"), request("b"))  # one on each slot
    third = request("c", output=20)
    engine.submit(third)
    engine.plan_step()  # takes slot 0; slot 1, idle, goes to host memory and is cleared
    assert engine.slot_of(third) is engine.slots[0]
    assert engine.slots[1].tokens == []
    assert engine.host_cache is not None
    assert len(engine.host_cache.entries) == 1
    fourth = request("d")
    engine.submit(fourth)
    engine.plan_step()  # the empty slot 1 loads the saved prompt back, with its checkpoints
    assert engine.slot_of(fourth) is engine.slots[1]
    assert fourth.cached == user_start(fourth.prompt)


def test_in_a_closed_loop_each_keyframe_reuses_the_shared_system_prompt_and_no_more() -> None:
    options = LlamaCppOptions(n_parallel=8, n_ctx=65536)
    engines: list[LlamaCppScheduler] = []

    def law(preset: object) -> LlamaCppScheduler:
        engines.append(LlamaCppScheduler(SPARK, 1.0, options))
        return engines[-1]

    for shape in (SEED_SHAPE, THINKING_OFF_SHAPE):
        figures = closed_loop(SPARK, 8, shape=shape, requests=40, warmup=8, law=law)
        counters = engines[-1].counters
        started = counters.prefix_cache_queries // shape.prompt_tokens
        assert figures.requests == 40
        # Each request reuses the 416-token system prompt from its slot's checkpoint, or (a slot's first
        # request: at most one a slot) nothing: never the user header after it, never the image.
        warm, rest = divmod(counters.prefix_cache_hits, shape.shared_prefix_tokens)
        assert rest == 0
        assert started - 8 <= warm < started


async def test_the_served_loop_runs_the_law_and_reports_the_reused_tokens_in_usage() -> None:
    engine = LlamaCppScheduler(SPARK, 0.0, HYBRID)
    engine.start()
    try:
        finishes = []
        for frame in ("a", "b"):
            events = [event async for event in engine.generate(request(frame, output=4))]
            assert len(events) == 5  # four tokens, then the finish with usage
            finish = events[-1]
            assert isinstance(finish, FinishEvent)
            finishes.append(finish)
    finally:
        await engine.stop()
    assert [finish.cached_tokens for finish in finishes] == [0, user_start(request("x").prompt)]
    assert engine.counters.requests_finished == 2


def test_both_laws_price_a_pass_with_the_same_hardware_cost_and_more_passes_read_the_weights_again() -> None:
    from deploy.simulator.engine import SimScheduler

    llamacpp, vllm = LlamaCppScheduler(SPARK, 1.0, HYBRID), SimScheduler(SPARK, 1.0)
    assert SPARK.weight_reads is not None
    for prefill, decode in ((1076, 0), (512, 3), (0, 8)):
        assert llamacpp._step_seconds(prefill, decode) == vllm._step_seconds(prefill, decode)
    bare = LlamaCppScheduler(SPARK.scaled(weight_reads=None), 1.0, HYBRID)
    reads = llamacpp._step_seconds(512, 0) - bare._step_seconds(512, 0)
    assert reads == pytest.approx(SPARK.weight_reads.seconds(512))
    # A 1,076-token prompt in -ub 512 micro-batches is three passes, each reading nearly every weight:
    whole = llamacpp._step_seconds(1076, 0)
    cut = sum(llamacpp._step_seconds(n, 0) for n in (512, 512, 52))
    assert cut - whole > 1.5 * SPARK.weight_reads.seconds(1076)


def test_decode_calls_count_the_batches_not_the_images_and_the_busy_slots_in_each() -> None:
    """``metrics_post_decode``: one n_decode per batch decoded (an image is decoded on its own, uncounted),
    every busy slot counted in it, idle ones not."""
    engine = LlamaCppScheduler(SPARK, 1.0, ATTENTION_ONLY)
    steps = run(engine, request("a", output=4))
    # the prompt's two text batches (before the image, and after it with the first token sampled), then the
    # three further tokens; the image's own pass is no decode call
    assert engine.n_decode == 5
    assert sum(step.passes for step in steps) > engine.n_decode  # the image's passes ran all the same
    assert engine.n_busy_slots == engine.n_decode  # one slot busy in each
    together = LlamaCppScheduler(SPARK, 1.0, ATTENTION_ONLY)
    run(together, request("a", output=4), request("b", output=4))
    assert together.n_busy_slots / together.n_decode == pytest.approx(2.0)  # both slots in every batch
