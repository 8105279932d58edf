"""`modgate deploy predict`: the simulator's figures for an engine's flags, beside the tuned baseline.

The seed spent restart windows on engine knobs that all made things worse: MTP speculative decoding and
the Spark fork's prefill-scheduling knobs. Each variant below is the shipped tuned compose file with the
flags an operator would have added for that round (the first two are the seed's measured rounds; the
others are the same knobs at other settings), and the prediction must rank the tuned file above it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli.main import app as modgate_app
from deploy.cli import deploy_app

SPARK_DIR = Path(__file__).resolve().parents[2] / "deploy" / "spark"
ANCHOR = '      - "--enable-prefix-caching"\n'

FAILED_ROUNDS = {
    "mtp": ["--speculative-config", '{"method":"mtp","num_speculative_tokens":4}'],
    "prefill-cap-256": ["--max-num-prefill-tokens-per-step", "256", "--prefill-compute-share", "0.2"],
    "prefill-share": ["--prefill-compute-share", "0.3", "--prefill-compute-half-life", "2"],
    "parallel-prefills": ["--max-parallel-prefills", "2", "--max-num-prefill-tokens-per-step", "512",
                          "--decode-refill-target", "6"],
    "long-prefill-threshold": ["--long-prefill-token-threshold", "256", "--max-num-partial-prefills", "2"],
}


def variant(folder: Path, extra: list[str]) -> Path:
    """The shipped compose file and its .env.example, with ``extra`` flags added to the engine's command."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (SPARK_DIR / "compose.yaml").read_text()
    assert ANCHOR in text
    added = "".join(f"      - {json.dumps(item)}\n" for item in extra)
    (folder / "compose.yaml").write_text(text.replace(ANCHOR, ANCHOR + added))
    shutil.copy(SPARK_DIR / ".env.example", folder / ".env")
    return folder


def predict_json(*args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(deploy_app, ["predict", "--format", "json", *args])
    assert result.exit_code == 0, result.output
    document: list[dict[str, object]] = json.loads(result.stdout)
    return document


def figures(document: dict[str, object], key: str) -> dict[str, float]:
    value = document[key]
    assert isinstance(value, dict)
    return value


def test_the_tuned_compose_predicts_the_baseline_and_says_which_flags_count() -> None:
    (engine,) = predict_json(str(SPARK_DIR), "--env-file", str(SPARK_DIR / ".env.example"))
    assert engine["service"] == "vllm"
    assert engine["in_flight"] == 8  # MODGATE_ENGINE__MAX_INFLIGHT in the gateway service
    assert engine["verdict"] == "same"
    assert figures(engine, "predicted") == figures(engine, "baseline")
    assert "--max-num-seqs 8" in engine["modelled"]  # type: ignore[operator]  # a JSON list
    assert "--gpu-memory-utilization 0.822" in engine["ignored"]  # type: ignore[operator]  # a JSON list
    assert engine["ignored_knobs"] == []
    assert engine["caveats"] == []


@pytest.mark.parametrize("round_name", sorted(FAILED_ROUNDS))
def test_the_tuned_configuration_ranks_above_each_failed_round(round_name: str, tmp_path: Path) -> None:
    (engine,) = predict_json(str(variant(tmp_path / round_name, FAILED_ROUNDS[round_name])))
    assert engine["verdict"] == "worse"
    predicted, baseline = figures(engine, "predicted"), figures(engine, "baseline")
    # Ranked on the rate first, then TTFT: never better on either.
    assert predicted["keyframes_per_min"] <= baseline["keyframes_per_min"] * 1.02
    assert predicted["ttft_mean_s"] > baseline["ttft_mean_s"] * 1.02 or (
        predicted["keyframes_per_min"] < baseline["keyframes_per_min"] * 0.98
    )


def test_mtp_costs_throughput_not_only_latency(tmp_path: Path) -> None:
    (engine,) = predict_json(str(variant(tmp_path, FAILED_ROUNDS["mtp"])))
    predicted, baseline = figures(engine, "predicted"), figures(engine, "baseline")
    assert predicted["keyframes_per_min"] < baseline["keyframes_per_min"]
    assert predicted["generation_tokens_per_s"] < baseline["generation_tokens_per_s"]
    assert engine["options"] == {
        "max_num_seqs": 8, "max_num_batched_tokens": 4096, "num_speculative_tokens": 4
    }


def test_knobs_without_a_mechanism_are_named_as_ignored(tmp_path: Path) -> None:
    (engine,) = predict_json(str(variant(tmp_path, FAILED_ROUNDS["parallel-prefills"])))
    assert engine["ignored_knobs"] == ["--decode-refill-target 6"]
    assert "--max-parallel-prefills 2" in engine["modelled"]  # type: ignore[operator]  # a JSON list


def test_the_text_output_puts_the_figures_beside_the_baseline(tmp_path: Path) -> None:
    folder = variant(tmp_path, FAILED_ROUNDS["prefill-cap-256"])
    result: Result = CliRunner().invoke(modgate_app, ["deploy", "predict", str(folder)])
    assert result.exit_code == 0, result.output
    assert "this compose" in result.stdout
    assert "tuned baseline" in result.stdout
    for label in ("keyframes/min", "TTFT mean (s)", "end to end mean (s)"):
        assert label in result.stdout
    assert "predicted: worse than the tuned baseline" in result.stdout
    assert "--max-num-prefill-tokens-per-step 256" in result.stdout
    assert "cutting prefills costs rate" in result.stdout  # the model's mechanism and its limit, said here


def test_the_last_of_a_repeated_flag_is_the_one_predicted(tmp_path: Path) -> None:
    (engine,) = predict_json(str(variant(tmp_path, ["--max-num-seqs", "4"])))
    assert engine["options"]["max_num_seqs"] == 4  # type: ignore[index]  # a JSON object
    assert engine["verdict"] == "worse"  # 8 callers, 4 slots: the rest queue for a slot


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-num-prefill-tokens-per-step", "lots"], "not an integer"),
        (["--prefill-compute-share", "1.5"], "between 0 and 1"),
        (["--speculative-config", "{mtp"], "not JSON"),
    ],
)
def test_an_unreadable_flag_value_exits_2(extra: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(deploy_app, ["predict", str(variant(tmp_path, extra))])
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_compose_file_without_an_engine_exits_2(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("services:\n  redis:\n    image: redis:7.4-alpine\n")
    result = CliRunner().invoke(deploy_app, ["predict", "--format", "json", str(tmp_path)])
    assert result.exit_code == 2
    assert "no engine service" in json.loads(result.stdout)["error"]
