"""`modgate deploy check` and `deploy predict` on llama.cpp's server: the shipped compose.llamacpp.yaml passes
and predicts beside the tuned vLLM; the fixtures' pitfalls are each named at their line."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from deploy.check import CheckReport, Finding, check_deploy
from deploy.cli import deploy_app, print_prediction

SPARK = Path(__file__).resolve().parents[2] / "deploy" / "spark"
SHIPPED = SPARK / "compose.llamacpp.yaml"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llamacpp"


def check(path: Path) -> CheckReport:
    return check_deploy([path], environ={}, compose_config=False)


def findings(report: CheckReport, rule: str) -> list[Finding]:
    return [finding for finding in report.findings if finding.rule == rule]


def line_of(path: Path, needle: str, after: str | None = None) -> int:
    lines = path.read_text().splitlines()
    start = next(n for n, text in enumerate(lines) if after in text) if after else 0
    return next(n for n, text in enumerate(lines[start:], start=start + 1) if needle in text)


def test_the_shipped_llamacpp_compose_file_has_no_errors_and_reads_its_own_env_example() -> None:
    report = check(SHIPPED)
    assert report.env_file == SPARK / ".env.llamacpp.example"
    assert report.errors == 0
    assert [f.rule for f in report.findings] == ["env-file"]  # cp .env.llamacpp.example .env.llamacpp
    assert "cp .env.llamacpp.example .env.llamacpp" in report.findings[0].message


def test_vllms_rules_do_not_judge_llama_cpps_flags() -> None:
    report = check(FIXTURES / "compose.pitfalls.yaml")
    rules = {f.rule for f in report.findings}
    vllm_rules = {"prompt-tokens-details", "max-inflight", "memory-fraction-mismatch", "scheduling-policy"}
    assert not rules & vllm_rules


def test_a_context_split_too_thin_among_the_slots_is_an_error_at_the_c_flag() -> None:
    path = FIXTURES / "compose.pitfalls.yaml"
    [finding] = findings(check(path), "llamacpp-slot-context")
    assert finding.severity == "error"
    assert finding.location.line == line_of(path, '"8192"')
    assert "1024 tokens a slot, below one keyframe's 1588" in finding.message  # 8192 / 8; 1,076 + 512
    assert "-c 12704" in finding.message


def test_a_gateway_cap_above_the_slots_is_an_error() -> None:
    path = FIXTURES / "compose.pitfalls.yaml"
    [finding] = findings(check(path), "llamacpp-slots")
    cap_line = line_of(path, "MODGATE_ENGINE__MAX_INFLIGHT")
    assert (finding.severity, finding.location.line) == ("error", cap_line)
    assert "MODGATE_ENGINE__MAX_INFLIGHT 16" in finding.message
    assert "8 slots" in finding.message


def test_a_prompt_cache_that_cannot_reuse_the_system_prompt_is_an_error() -> None:
    path = FIXTURES / "compose.pitfalls.yaml"
    found = findings(check(path), "llamacpp-prompt-cache")
    by_severity = {(f.severity, f.location.line) for f in found}
    assert ("error", line_of(path, "--no-cache-prompt")) in by_severity
    assert ("error", line_of(path, '"0"', after="--ctx-checkpoints")) in by_severity
    assert ("warning", line_of(path, '"256"', after="--cache-reuse")) in by_severity  # off with mmproj
    [checkpoints] = [f for f in found if "--ctx-checkpoints 0" in f.message]
    assert "recurrent" in checkpoints.message


def test_layers_left_on_the_cpu_are_an_error_against_the_models_layer_count() -> None:
    path = FIXTURES / "compose.pitfalls.yaml"
    [finding] = findings(check(path), "llamacpp-gpu-layers")
    assert (finding.severity, finding.location.line) == ("error", line_of(path, '"40"'))
    assert "8 run on the Spark's CPU" in finding.message  # MODEL_LAYERS=48 in .env.pitfalls


def test_no_metrics_endpoint_is_an_error() -> None:
    [finding] = findings(check(FIXTURES / "compose.pitfalls.yaml"), "llamacpp-server")
    assert finding.severity == "error"
    assert "--metrics" in finding.message


def test_the_servers_defaults_four_unified_slots_auto_layers_no_projector_are_named() -> None:
    report = check(FIXTURES / "compose.defaults.yaml")
    assert report.env_file == FIXTURES / ".env.defaults"
    [slots] = findings(report, "llamacpp-slots")
    assert "the server's auto: 4 slots" in slots.message
    assert "MODGATE_ENGINE__MAX_INFLIGHT 8" in slots.message  # the gateway's default
    [context] = findings(report, "llamacpp-slot-context")
    assert "-c 1024 is shared by" in context.message  # LLAMA_ARG_CTX_SIZE, unified among auto slots
    [layers] = findings(report, "llamacpp-gpu-layers")
    assert layers.severity == "warning"
    [server] = findings(report, "llamacpp-server")
    assert "--mmproj" in server.message


def test_deploy_predict_prints_llama_cpp_beside_the_tuned_vllm_thinking_on_and_off() -> None:
    result = CliRunner().invoke(deploy_app, ["predict", str(SHIPPED), "--format", "json"])
    assert result.exit_code == 0, result.output
    (engine,) = json.loads(result.stdout)
    assert (engine["service"], engine["engine"], engine["in_flight"]) == ("llamacpp", "llamacpp", 8)
    assert engine["options"]["n_parallel"] == 8
    assert engine["options"]["n_ctx"] == 32768
    for figures in (engine, engine["thinking_off"]):
        for side in ("predicted", "baseline"):
            assert set(figures[side]) >= {"keyframes_per_min", "ttft_mean_s", "e2e_mean_s"}
    # Thinking off is a shorter request on both engines: more keyframes a minute than thinking on.
    assert engine["thinking_off"]["baseline"]["keyframes_per_min"] > engine["baseline"]["keyframes_per_min"]
    assert engine["thinking_off"]["predicted"]["keyframes_per_min"] > engine["predicted"]["keyframes_per_min"]
    # One per-pass hardware cost for both laws: the GGUF's weight reads price llama.cpp's passes.
    assert "weights its prompt tokens route to at 273 GB/s" in engine["assumptions"][0]
    assert "GGUF (91 GB" in engine["assumptions"][0]
    reused = engine["reused_prompt_tokens_per_request"]
    assert 0 < reused["on"] <= 416  # at most the system prompt, from the slot's checkpoint
    assert any("no speculative decoding" in text for text in engine["assumptions"])
    assert any("per-step hardware cost" in text for text in engine["assumptions"])
    assert "--parallel 8" in engine["modelled"]

    console = Console(record=True, width=200)
    print_prediction(engine, console)  # what `deploy predict` prints without --format json
    text = console.export_text()
    assert "thinking off (3 output tokens" in text
    assert "prompt tokens its cache reused, per keyframe" in text
    assert "assumes: no speculative decoding" in text
    assert "assumes: the per-step hardware cost the vLLM model uses" in text
