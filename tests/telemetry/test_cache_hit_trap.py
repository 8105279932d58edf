"""The trap (docs/spark.md): after a burst of identical probes, the engine's since-start hit ratio still looks
healthy while production requests get nothing from the cache. The gateway's windowed rates must show ~0.

Simulator: instant preset with a 500-token block. An identical 1,004-token request (Qwen's BPE) reuses 1,000
tokens; requests with different keyframes share only the 337-token prefix before the image, less than one
block, so they reuse nothing. The windows run on a fake clock; the engine is scraped on demand.
"""

from __future__ import annotations

import math

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deploy.keyframes import make_keyframe
from gateway.caller import Caller
from gateway.http.auth import KeyRing
from gateway.http.services import open_services
from gateway.settings import Settings
from gateway.telemetry.windows import read_engine_cache_counters, stats_document
from gateway.wire import ModerationRequest
from shaping.image import ImageLimits, shape_image
from shaping.prompt import RequestOptions, build_chat_request, load_system_prompt
from shaping.tokens import TokenGrid
from tests.support import FakeClock, SimFactory, image_input

WINDOW_S = 300.0
PROBES = 20
PRODUCTION_FRAMES = 6



def probe_body(model: str) -> dict[str, object]:
    """A production-shaped engine request for one fixed keyframe: what a benchmark or a probe repeats."""
    shaping = Settings().shaping
    frame = shape_image(
        make_keyframe("allow", seed=4242),
        ImageLimits(),
        TokenGrid(pixels_per_token=shaping.pixels_per_token, token_budget=shaping.image_token_budget),
    )
    options = RequestOptions(model=model, enable_thinking=False, max_completion_tokens=16, stream=False)
    return build_chat_request(load_system_prompt(), [frame], shaping.user_text, options)


def gauge(text: str, name: str) -> float:
    """The value of an unlabelled gauge in Prometheus text."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return float(family.samples[0].value)
    raise AssertionError(f"{name} not in /metrics")


async def test_windowed_hit_rate_is_zero_for_production_while_the_since_start_ratio_looks_healthy(
    start_sim: SimFactory,
) -> None:
    # A block over the shared prefix (the system prompt and template, 337 of Qwen's tokens): production frames
    # can never hit, while a repeated 1,004-token probe reuses two whole blocks, all but its last 4 tokens.
    sim = start_sim("instant", block_size=500)
    clock = FakeClock()
    # the plain prompt, as before the prefix strategy: auto would fill the 500-token block and hit
    settings = Settings(
        engine={"url": sim.url},
        telemetry={"window_s": WINDOW_S, "engine_scrape_interval_s": 0},
        shaping={"prefix_strategy": "off"},
    )
    keys = KeyRing({}, None)
    async with open_services(settings, keys, clock=clock) as services:
        scraper = services.engine_cache
        assert await scraper.scrape_once() is not None  # the base, before any traffic

        # A burst of identical probes straight at the engine (a benchmark, or someone checking the cache).
        body = probe_body(await services.moderation.engine_model())
        for i in range(PROBES):
            await services.engine.chat(body, f"probe-{i}")
        clock.advance(10)
        await scraper.scrape_once()
        during_burst = scraper.window.window_rate().ratio
        assert during_burst is not None
        assert during_burst > 0.9

        # Time passes; then production traffic: unique keyframes through the gateway's own path.
        clock.advance(2 * WINDOW_S)
        await scraper.scrape_once()
        caller = Caller(tenant="t", key_id="test")
        for seed in range(PRODUCTION_FRAMES):
            frame = make_keyframe("allow", seed=100 + seed)
            request = ModerationRequest.model_validate({"input": image_input(frame)})
            response = await services.moderation.moderate(request, caller, None)
            assert response.results[0].modgate.cached_tokens == 0
        clock.advance(15)
        await scraper.scrape_once()

        # What the engine's counters say since start: a healthy-looking ~70 %.
        async with httpx.AsyncClient() as client:
            engine_metrics = (await client.get(f"{sim.url}/metrics")).text
        since_start = read_engine_cache_counters(engine_metrics).since_start_ratio
        assert since_start is not None
        assert since_start > 0.6

        # What the gateway reports: the truth for the last window.
        engine_rate = scraper.window.window_rate()
        assert engine_rate.queries > 0
        assert engine_rate.ratio is not None
        assert engine_rate.ratio < 0.02
        document = stats_document(services.recent, scraper)
        assert document["cache"]["engine_window_hit_rate"] < 0.02
        assert document["cache"]["gateway_cached_share"] == 0.0
        assert document["keyframes"] == PRODUCTION_FRAMES
        metrics = generate_latest(services.metrics.registry).decode()
        assert gauge(metrics, "modgate_window_engine_prefix_cache_hit_ratio") < 0.02
        assert gauge(metrics, "modgate_window_prompt_cached_ratio") == 0.0
        assert gauge(metrics, "modgate_engine_kv_block_size_tokens") == 500


async def test_the_windowed_rate_is_nan_not_zero_when_the_engine_served_nothing(
    start_sim: SimFactory,
) -> None:
    # A block over the shared prefix (the system prompt and template, 337 of Qwen's tokens): production frames
    # can never hit, while a repeated 1,004-token probe reuses two whole blocks, all but its last 4 tokens.
    sim = start_sim("instant", block_size=500)
    clock = FakeClock()
    settings = Settings(engine={"url": sim.url}, telemetry={"window_s": WINDOW_S,
                                                            "engine_scrape_interval_s": 0})
    async with open_services(settings, KeyRing({}, None), clock=clock) as services:
        await services.engine_cache.scrape_once()
        clock.advance(30)
        await services.engine_cache.scrape_once()
        metrics = generate_latest(services.metrics.registry).decode()
        assert math.isnan(gauge(metrics, "modgate_window_engine_prefix_cache_hit_ratio"))
        document = stats_document(services.recent, services.engine_cache)
        assert document["cache"]["engine_window_hit_rate"] is None
