"""TTFT, decode and end-to-end times are measured and recorded for streamed and non-streamed engine calls.

The simulator runs the Spark preset at 2 % of its pace, so prefill and decode take measurable (small) time;
the tests check what is recorded and how the figures relate, never how long anything took.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deploy.keyframes import make_keyframe
from gateway.caller import Caller
from gateway.engine.answers import EngineAnswer
from gateway.engine.client import EngineClient
from gateway.http.auth import KeyRing
from gateway.http.services import open_services
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.telemetry.recorder import FinishedRequest, RequestRecorder
from gateway.telemetry.windows import RecentRequests
from gateway.wire import ModerationDetails, ModerationRequest
from shaping.image import ImageLimits, shape_image
from shaping.prompt import RequestOptions, build_chat_request, load_system_prompt
from shaping.tokens import TokenGrid
from tests.support import SimFactory, image_input

TIME_SCALE = 0.02


def histogram_counts(metrics: GatewayMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {
        sample.name.removesuffix("_count"): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith("_count")
    }


async def test_a_streamed_engine_call_records_ttft_decode_and_end_to_end(start_sim: SimFactory) -> None:
    sim = start_sim("spark", time_scale=TIME_SCALE)
    settings = Settings(engine={"url": sim.url}, telemetry={"engine_scrape_interval_s": 0})
    async with open_services(settings, KeyRing({}, None)) as services:
        request = ModerationRequest.model_validate({"input": image_input(make_keyframe("allow", seed=11))})
        response = await services.moderation.moderate(request, Caller(tenant="t", key_id="k"), None)
        details = response.results[0].modgate
        assert details.ttft_ms is not None
        assert details.ttft_ms > 0
        assert details.decode_ms is not None
        assert details.decode_ms > 0
        assert details.ttft_ms + details.decode_ms <= details.latency_ms + 0.05  # rounding to 0.01 ms
        counts = histogram_counts(services.metrics)
        for name in (
            "modgate_engine_ttft_seconds",
            "modgate_engine_decode_seconds",
            "modgate_request_seconds",
        ):
            assert counts[name] == 1, name
        summary = services.recent.summary()
        assert summary.latencies["ttft"].count == summary.latencies["end_to_end"].count == 1
        assert summary.latencies["ttft"].p50 == details.ttft_ms / 1000


def details_from(answer: EngineAnswer) -> ModerationDetails:
    """The timing fields as the moderation path fills them from an engine answer."""
    assert answer.ttft_s is not None
    usage = answer.usage
    return ModerationDetails(
        action="allow",
        thinking="on",
        thinking_rule="default",
        policy_version=1,
        latency_ms=answer.total_s * 1000,
        queue_ms=0.0,
        shaping_ms=0.0,
        ttft_ms=answer.ttft_s * 1000,
        decode_ms=(answer.total_s - answer.ttft_s) * 1000,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        image_tokens=usage.image_tokens,
        completion_tokens=usage.completion_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        frame_sha256=None,
        request_id=answer.request_id,
    )


async def test_streamed_and_non_streamed_engine_calls_both_give_a_first_token_time(
    start_sim: SimFactory,
) -> None:
    sim = start_sim("spark", time_scale=TIME_SCALE)
    shaping = Settings().shaping
    grid = TokenGrid(pixels_per_token=shaping.pixels_per_token, token_budget=shaping.image_token_budget)
    frame = shape_image(make_keyframe("allow", seed=12), ImageLimits(), grid)
    engine = EngineClient(
        sim.url,
        connect_timeout_s=2,
        first_token_timeout_s=30,
        total_timeout_s=60,
        connect_retries=0,
        max_connections=2,
    )
    metrics = GatewayMetrics()
    recorder = RequestRecorder(metrics, RecentRequests(60))
    answers: dict[bool, EngineAnswer] = {}
    try:
        for stream in (True, False):
            options = RequestOptions(
                model="qwen3-vl-moe-sim", enable_thinking=True, max_completion_tokens=256, stream=stream
            )
            body = build_chat_request(load_system_prompt(), [frame], shaping.user_text, options)
            answers[stream] = await engine.chat(body, f"latency-{stream}")
            answered = details_from(answers[stream])
            finished = FinishedRequest(f"modr-{stream}", "default", frames=1, results=[answered])
            recorder.finished(finished, latency_s=answered.latency_ms / 1000)
    finally:
        await engine.aclose()
    streamed, whole = answers[True], answers[False]
    assert streamed.streamed
    assert not whole.streamed
    assert streamed.ttft_s is not None
    assert 0 < streamed.ttft_s < streamed.total_s
    # Not streamed, the first token arrives with the whole answer: TTFT is the answer's time, decode ~0.
    assert whole.ttft_s is not None
    assert 0 < whole.ttft_s <= whole.total_s
    assert whole.usage.completion_tokens > 0
    assert streamed.usage.completion_tokens > 0
    counts = histogram_counts(metrics)
    assert counts["modgate_engine_decode_seconds"] == 2
    latencies = recorder.recent.summary().latencies
    assert latencies["ttft"].count == latencies["end_to_end"].count == 2
