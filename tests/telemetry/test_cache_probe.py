"""``modgate cache probe``: per-request cached_tokens, counter deltas and a diagnosis, against simulators
with the Spark's 2,960-token block, a 512-token block (identical requests hit, production cannot) and a
16-token block (the shared prefix hits)."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from cli.cache_probe import max_reusable_tokens, probe_engine
from cli.main import app
from deploy.simulator.llamacpp_law import LlamaCppOptions
from deploy.simulator.tokenizer import render_chat
from shaping.prompt import load_system_prompt, prompt_version_for
from shaping.verdict import VerdictFormat
from tests.support import SimFactory


def probe_output(*args: str) -> str:
    result = CliRunner().invoke(app, ["cache", "probe", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_sparks_block_is_diagnosed_as_one_the_cache_cannot_hit(start_sim: SimFactory) -> None:
    sim = start_sim("spark", time_scale=0.0)
    output = probe_output("--engine-url", sim.url)
    assert "KV block: 2,960 tokens (vllm:cache_config_info)" in output
    assert re.search(r"block 2,960 > request 1,\d{3} tokens: the prefix cache cannot hit", output), output
    assert re.search(r"block 2,960 > shared prefix \d{3} tokens", output), output
    assert re.search(r"production-shaped\s+1,\d{3}\s+0\n", output), output


def test_a_block_between_the_shared_prefix_and_the_request_hits_only_for_identical_requests(
    start_sim: SimFactory,
) -> None:
    sim = start_sim("instant", block_size=512)
    result = CliRunner().invoke(app, ["cache", "probe", "--engine-url", sim.url, "--json", "--repeats", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    first, *again = report["repeated"]
    assert first["cached_tokens"] == 0
    # whole 512-token blocks short of the last token: one block of the ~1,000-token probe (Qwen's BPE)
    whole = (first["prompt_tokens"] - 1) // 512 * 512
    assert whole >= 512
    assert [call["cached_tokens"] for call in again] == [whole, whole]
    assert report["production"]["cached_tokens"] == 0
    assert report["counter_hits"] == 2 * whole
    assert report["counter_queries"] == 4 * report["production"]["prompt_tokens"]
    assert report["diagnosis"][0].startswith(f"the repeated probe reused {whole:,} of")
    assert report["diagnosis"][1].startswith("block 512 > shared prefix")


async def test_a_small_block_lets_production_requests_reuse_the_shared_prefix(start_sim: SimFactory) -> None:
    sim = start_sim("instant")  # 16-token blocks
    report = await probe_engine(sim.url, seed=3)
    assert report.block_size == 16
    assert report.block_size_from == "engine"
    assert report.shared_prefix_tokens is not None
    assert (
        report.production.cached_tokens
        >= max_reusable_tokens(report.production.prompt_tokens, 16, report.shared_prefix_tokens)
        > 0
    )
    assert any("the shared prefix hits" in line for line in report.diagnosis)


async def test_a_block_size_given_by_flag_wins_over_the_engines(start_sim: SimFactory) -> None:
    sim = start_sim("instant")
    report = await probe_engine(sim.url, block_size=4096, seed=3)
    assert report.block_size == 4096
    assert report.block_size_from == "flag"


def test_the_most_a_request_can_reuse_is_whole_blocks_before_its_last_token() -> None:
    assert max_reusable_tokens(1076, 2960) == 0
    assert max_reusable_tokens(271, 128) == 256  # real CPU vLLM (deploy/tiny_vlm/ENGINE_FACTS.md)
    assert max_reusable_tokens(257, 128) == 256
    assert max_reusable_tokens(256, 128) == 128
    assert max_reusable_tokens(1076, 128, shared_tokens=416) == 384


def test_an_unreachable_engine_is_reported_without_a_traceback() -> None:
    result = CliRunner().invoke(app, ["cache", "probe", "--engine-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cache probe failed" in result.output


def system_message_tokens(verdict_format: VerdictFormat) -> int:
    """The system message the probe measures, as the simulator's tokenizer counts it."""
    text = load_system_prompt(prompt_version_for(verdict_format)).text
    return len(render_chat([("system", [text])], enable_thinking=False, add_generation_prompt=False))


async def test_the_probe_sends_the_compact_prompt_unless_json_is_asked(start_sim: SimFactory) -> None:
    sim = start_sim("instant")
    default = await probe_engine(sim.url, seed=3)
    assert default.verdict_format == "compact"
    assert default.shared_prefix_tokens == system_message_tokens("compact")
    asked = await probe_engine(sim.url, seed=3, verdict_format="json")
    assert asked.verdict_format == "json"
    assert asked.shared_prefix_tokens == system_message_tokens("json")
    assert asked.production.prompt_tokens - default.production.prompt_tokens == (
        system_message_tokens("json") - system_message_tokens("compact")
    )  # the same keyframe and text: the requests differ by their system prompt only


def test_the_verdict_format_is_a_probe_option(start_sim: SimFactory) -> None:
    sim = start_sim("instant")
    output = probe_output("--engine-url", sim.url, "--verdict-format", "json")
    assert "json verdict" in output
    assert "compact verdict" in probe_output("--engine-url", sim.url)


def test_llamacpp_is_probed_without_a_block_and_in_its_own_counters(start_sim: SimFactory) -> None:
    sim = start_sim("instant", time_scale=0.0, kind="llamacpp")
    output = probe_output("--engine-url", sim.url)
    assert "KV block: none: llama.cpp reuses a slot's common prefix token by token" in output
    assert "pass --block-size" not in output  # there is no block to give
    calls = re.findall(r"(repeated probe \d|production-shaped)\s+([\d,]+)\s+([\d,]+)", output)
    cached = {label: int(value.replace(",", "")) for label, _prompt, value in calls}
    # token by token: the repeat reuses nearly all of the prompt, production the shared system prompt
    assert cached["repeated probe 2"] > cached["production-shaped"] > 0, output
    assert re.search(r"engine counters across the probe: [\d,]+ hits / [\d,]+ queried tokens", output), output


async def test_llamacpp_without_its_prompt_cache_is_told_which_setting(start_sim: SimFactory) -> None:
    sim = start_sim(
        "instant", time_scale=0.0, kind="llamacpp", llamacpp=LlamaCppOptions(cache_prompt=False)
    )
    report = await probe_engine(sim.url, seed=3)
    assert report.engine_kind == "llamacpp"
    assert report.block_size is None
    assert [call.cached_tokens for call in report.repeated] == [0, 0]
    assert "--cache-prompt is off" in report.diagnosis[0], report.diagnosis
    assert "--slot-prompt-similarity" in report.diagnosis[1], report.diagnosis
