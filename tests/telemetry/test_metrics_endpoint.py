"""``GET /metrics`` (Prometheus text, parsed with prometheus_client's own parser), ``GET /stats`` and
``modgate stats``, against a live gateway in front of the instant simulator."""

from __future__ import annotations

import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app
from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory, data_url, image_input

HISTOGRAMS = (
    "modgate_request_seconds",
    "modgate_engine_ttft_seconds",
    "modgate_queue_wait_seconds",
    "modgate_shaping_seconds",
    "modgate_engine_decode_seconds",
)


def moderate(gateway: ThreadedServer, *frames: bytes) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/moderations", json={"input": image_input(*frames)}, timeout=30)


def samples(gateway: ThreadedServer) -> dict[str, list[Sample]]:
    """Every family of ``/metrics``, parsed by prometheus_client (which raises on malformed text)."""
    response = httpx.get(f"{gateway.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {family.name: family.samples for family in text_string_to_metric_families(response.text)}


def value(families: dict[str, list[Sample]], sample_name: str, **labels: str) -> float:
    family = sample_name.removesuffix("_total").removesuffix("_count")
    for sample in families[family]:
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    raise AssertionError(f"no sample {sample_name}{labels}")


def stats_when(gateway: ThreadedServer, ready: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    """``GET /stats`` once ``ready(document)`` holds (the engine is scraped in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        document: dict[str, Any] = httpx.get(f"{gateway.url}/stats").json()
        if ready(document) or time.monotonic() > deadline:
            return document
        time.sleep(0.02)


def test_metrics_parse_and_carry_histograms_counters_and_gauges(
    start_gateway: GatewayFactory, start_sim: SimFactory
) -> None:
    sim = start_sim("instant", block_size=128)
    gateway = start_gateway(engine_url=sim.url, telemetry={"engine_scrape_interval_s": 0.05})
    for seed in range(3):
        assert moderate(gateway, make_keyframe("allow", seed=seed)).status_code == 200
    families = samples(gateway)
    for histogram in HISTOGRAMS:
        assert value(families, f"{histogram}_count") == 3, histogram
    assert value(families, "modgate_requests_total", route="moderations", outcome="ok") == 3
    assert value(families, "modgate_frames_total", action="allow", thinking="on") == 3
    assert {"modgate_unparsable_outputs", "modgate_reused_verdicts"} <= families.keys()
    assert value(families, "modgate_engine_inflight") == 0
    assert value(families, "modgate_engine_queued") == 0
    assert value(families, "modgate_thinking_default_on") == 1
    assert value(families, "modgate_window_keyframes_per_minute") > 0
    assert value(families, "modgate_window_thinking_share") == 1
    assert value(families, "modgate_window_seconds") == 300
    assert value(families, "modgate_window_prompt_cached_ratio") >= 0  # a number, not NaN, after traffic


def test_a_failed_request_is_counted_by_its_outcome(gateway: ThreadedServer) -> None:
    body = {"input": [{"type": "image_url", "image_url": {"url": data_url(b"\xff\xd8\xff" + b"\0" * 64)}}]}
    response = httpx.post(f"{gateway.url}/v1/moderations", json=body, timeout=30)
    assert 400 <= response.status_code < 500
    families = samples(gateway)
    failed = [s for s in families["modgate_requests"] if s.name == "modgate_requests_total" and s.value == 1]
    assert [s.labels["outcome"] for s in failed] != ["ok"]
    assert len(failed) == 1


def test_stats_give_percentiles_throughput_thinking_share_and_windowed_cache_rates(
    start_gateway: GatewayFactory, start_sim: SimFactory
) -> None:
    sim = start_sim("instant")  # 16-token blocks: the ~390-token prefix before each keyframe is reused
    gateway = start_gateway(engine_url=sim.url, telemetry={"engine_scrape_interval_s": 0.05})
    for seed in range(4):
        assert moderate(gateway, make_keyframe("review", seed=20 + seed)).status_code == 200
    document = stats_when(gateway, lambda d: (d["cache"]["engine_window_queries"] or 0) >= 4 * 1000)
    assert document["keyframes"] == 4
    assert document["keyframes_per_minute"] > 0
    assert document["thinking_share"] == 1.0
    for name in ("end_to_end", "ttft", "queue_wait", "shaping", "decode"):
        row = document["latency_ms"][name]
        assert row["count"] == 4, name
        assert row["p50"] <= row["p95"] <= row["p99"], name
    assert document["latency_ms"]["ttft"]["p99"] <= document["latency_ms"]["end_to_end"]["p99"]
    cache = document["cache"]
    assert (cache["engine_block_size"], cache["engine_kind"]) == (16, "vllm")
    assert 0.2 < cache["gateway_cached_share"] < 0.5  # 3 of 4 calls reuse the shared prefix, ~36 % each
    assert 0.2 < cache["engine_window_hit_rate"] < 0.5
    assert document["tokens"]["prompt"] > document["tokens"]["cached"] > 0
    assert (document["inflight"], document["queued"], document["thinking_default"]) == (0, 0, "on")


def test_stats_read_llamacpps_cache_counters_into_the_same_window(
    start_gateway: GatewayFactory, start_sim: SimFactory
) -> None:
    """In front of llama-server the window reads ``llamacpp:prompt_tokens_total`` (processed) and
    ``prompt_tokens_cached_total``: looked up = both, found = cached; no block size (token by token)."""
    sim = start_sim("instant", kind="llamacpp")
    gateway = start_gateway(engine_url=sim.url, telemetry={"engine_scrape_interval_s": 0.05})
    for seed in range(4):
        assert moderate(gateway, make_keyframe("review", seed=30 + seed)).status_code == 200
    document = stats_when(gateway, lambda d: (d["cache"]["engine_window_queries"] or 0) >= 4 * 1000)
    cache = document["cache"]
    assert (cache["engine_block_size"], cache["engine_kind"]) == (None, "llamacpp")
    # the engine's counters and the answers' cached_tokens say the same: the system prompt, calls 2 to 4
    assert document["tokens"]["prompt"] > document["tokens"]["cached"] > 0
    assert cache["engine_window_hits"] == document["tokens"]["cached"]
    assert cache["engine_window_hit_rate"] == cache["gateway_cached_share"]
    assert 0 < cache["engine_window_hit_rate"] < 0.5
    result = CliRunner().invoke(app, ["stats", "--url", gateway.url])
    assert result.exit_code == 0, result.output
    assert "none: llama.cpp, token by token" in result.output  # not "unknown": there is no block


def test_the_thinking_gauge_follows_the_policy(gateway: ThreadedServer) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    policy = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=headers).json()
    policy.update(default_mode="off", reason="telemetry test: thinking off")
    assert httpx.put(f"{gateway.url}/admin/thinking-policy", json=policy, headers=headers).status_code == 200
    assert value(samples(gateway), "modgate_thinking_default_on") == 0


def test_modgate_stats_prints_the_window_as_a_table(gateway: ThreadedServer) -> None:
    assert moderate(gateway, make_keyframe("allow", seed=9)).status_code == 200
    result = CliRunner().invoke(app, ["stats", "--url", gateway.url])
    assert result.exit_code == 0, result.output
    for label in (
        "end to end",
        "time to first token",
        "queue wait",
        "shaping",
        "decode",
        "p95",
        "keyframes per minute",
        "engine prefix-cache hit rate, window",
        "thinking on",
    ):
        assert label in result.output, label


def test_modgate_stats_says_when_the_gateway_cannot_be_reached() -> None:
    result = CliRunner().invoke(app, ["stats", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot read" in result.output


def test_image_tokens_an_engine_does_not_count_are_null_with_the_reason_not_0(
    start_gateway: GatewayFactory, start_sim: SimFactory
) -> None:
    # llama.cpp's usage has no image count: the result and the window say "unknown, and why"; 0 would read as
    # "the frame cost no image tokens". vLLM's count is the engine's own.
    for kind, counted in (("llamacpp", False), ("vllm", True)):
        sim = start_sim("instant", kind=kind, **({"vision": True} if kind == "llamacpp" else {}))
        gateway = start_gateway(engine_url=sim.url)
        response = moderate(gateway, make_keyframe("allow", seed=40))
        assert response.status_code == 200, response.text
        details = response.json()["results"][0]["modgate"]
        tokens = httpx.get(f"{gateway.url}/stats").json()["tokens"]
        if counted:
            assert details["image_tokens"] > 0
            assert details["image_tokens_reason"] is None
            assert (tokens["image"], tokens["image_reason"]) == (details["image_tokens"], None)
        else:
            assert details["image_tokens"] is None
            assert "reports no image tokens" in details["image_tokens_reason"]
            assert tokens["image"] is None
            assert tokens["image_reason"] == details["image_tokens_reason"]
        assert details["prompt_tokens"] > 0
