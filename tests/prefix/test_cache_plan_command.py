"""``modgate cache plan`` on the simulator: what the prefix cache can ever reuse, and the fill that hits."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app
from shaping.prefix import guidance_version_for, load_guidance
from shaping.prompt import load_system_prompt, prompt_version_for
from tests.support import SimFactory

runner = CliRunner()


def test_on_the_spark_preset_no_request_can_hit_and_the_fill_is_named() -> None:
    result = runner.invoke(app, ["cache", "plan"])
    assert result.exit_code == 0, result.output
    assert "prefix-cache block 2,960 tokens" in result.output
    assert "< block 2,960: no request can hit" in result.output
    assert "fill the shared prefix with" in result.output
    assert "from the cache         0 tokens per request" in result.output


def test_the_fill_makes_every_later_request_with_its_own_keyframe_hit_a_whole_block() -> None:
    result = runner.invoke(app, ["cache", "plan", "--fill", "--verify", "3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [call["cached_tokens"] for call in report["verified"]] == [0, 0, 0]
    filled = [call["cached_tokens"] for call in report["verified_filled"]]
    assert filled == [0, 2960, 2960]  # the first request computes the block; every later one reuses it
    assert report["filled_plan"]["cacheable_tokens"] == 2960
    assert report["filled"]["shared_tokens"] >= 2960
    after = report["verified_filled"][1]["prompt_tokens"] - 2960
    assert after < report["verified"][1]["prompt_tokens"]  # fewer tokens computed per keyframe


def test_packing_divides_the_prompt_among_the_frames(start_sim: SimFactory) -> None:
    engine = start_sim("spark")
    one = json.loads(runner.invoke(app, ["cache", "plan", "--engine-url", engine.url, "--json"]).output)
    four = json.loads(
        runner.invoke(
            app, ["cache", "plan", "--engine-url", engine.url, "--frames-per-request", "4", "--json"]
        ).output
    )
    per_frame_one = one["plan"]["shape"]["prompt_tokens"]
    per_frame_four = four["plan"]["shape"]["prompt_tokens"] / 4
    assert per_frame_four < per_frame_one
    assert four["plan"]["shape"]["shared_prefix_tokens"] == one["plan"]["shape"]["shared_prefix_tokens"]


def test_the_engines_block_size_can_be_overridden(start_sim: SimFactory) -> None:
    engine = start_sim("instant")  # block 16
    arguments = ["cache", "plan", "--engine-url", engine.url, "--block-size", "128", "--json"]
    result = runner.invoke(app, arguments)
    report = json.loads(result.output)
    assert report["block_size"] == 128
    shared = report["plan"]["shape"]["shared_prefix_tokens"]
    assert report["plan"]["cacheable_tokens"] == shared // 128 * 128


def test_a_malformed_frame_size_is_refused() -> None:
    result = runner.invoke(app, ["cache", "plan", "--frame", "1280by720"])
    assert result.exit_code == 2
    assert "1280x720" in result.output


def test_an_engine_that_does_not_answer_fails_with_a_message() -> None:
    result = runner.invoke(app, ["cache", "plan", "--engine-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cache plan failed" in result.output


def test_the_plan_uses_the_compact_prompt_and_its_guidance_unless_json_is_asked(
    start_sim: SimFactory,
) -> None:
    engine = start_sim("instant")
    # A 1,024-token block takes the fill past the guidance's first lines, which both versions share.
    plan = ["cache", "plan", "--engine-url", engine.url, "--block-size", "1024", "--fill", "--json"]
    asked = {"default": [], "compact": ["--verdict-format", "compact"], "json": ["--verdict-format", "json"]}
    reports = {name: json.loads(runner.invoke(app, [*plan, *flags]).output) for name, flags in asked.items()}
    assert reports["default"] == reports["compact"]
    guidance = {
        verdict_format: "\n".join(load_guidance(guidance_version_for(verdict_format)))
        for verdict_format in ("compact", "json")
    }
    for verdict_format, whole in guidance.items():
        report = reports[verdict_format]
        assert report["verdict_format"] == verdict_format
        assert report["system_characters"] == len(load_system_prompt(prompt_version_for(verdict_format)).text)
        assert report["filled"]["guidance"]
        assert whole.startswith(report["filled"]["guidance"])
    assert not guidance["json"].startswith(reports["compact"]["filled"]["guidance"])


def test_an_unknown_verdict_format_is_refused() -> None:
    result = runner.invoke(app, ["cache", "plan", "--verdict-format", "yaml"])
    assert result.exit_code == 2
    assert "compact" in result.output


def test_llamacpp_has_no_block_to_plan_and_the_probe_is_named(start_sim: SimFactory) -> None:
    engine = start_sim("instant", kind="llamacpp")
    result = CliRunner().invoke(app, ["cache", "plan", "--engine-url", engine.url])
    assert result.exit_code == 1
    assert "token by token" in result.output
    assert "modgate cache probe" in result.output
