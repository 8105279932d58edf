"""`deploy check` rules: the shipped Spark files pass; each bad fixture is reported at its file and line."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from deploy.check import CheckReport, Finding, Location, UnreadableInputError, check_deploy

SPARK_DIR = Path(__file__).resolve().parents[2] / "deploy" / "spark"

# Passes every rule with GOOD_ENV; each test swaps one piece of it for a bad one.
GOOD_COMPOSE = """\
services:
  vllm:
    image: vllm/vllm-openai:v0.32.0
    entrypoint: ["vllm", "serve"]
    command:
      - "some/model"
      - "--gpu-memory-utilization"
      - "${GPU_MEM_UTIL}"
      - "--max-num-seqs"
      - "8"
      - "--enable-prompt-tokens-details"
      - "--scheduling-policy"
      - "priority"
      - "--enable-prefix-caching"
      - "--max-num-queued-reqs"
      - "16"
    environment:
      PYTORCH_ALLOC_CONF: "per_process_memory_fraction:${GPU_MEM_UTIL}"
  gateway:
    image: modgate-gateway:local
    environment:
      MODGATE_ENGINE__URL: "http://vllm:8000"
      MODGATE_ENGINE__MAX_INFLIGHT: "8"
"""
GOOD_ENV = "GPU_MEM_UTIL=0.822\n"


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """The 1-based line of the `occurrence`-th line that contains `needle`."""
    hits = [number for number, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) >= occurrence, f"{needle!r} occurs {len(hits)} times in the fixture"
    return hits[occurrence - 1]


def with_items(*items: str, compose: str = GOOD_COMPOSE) -> str:
    """GOOD_COMPOSE with engine command items appended after --enable-prefix-caching."""
    anchor = '      - "--enable-prefix-caching"\n'
    return compose.replace(anchor, anchor + "".join(f"      - {item}\n" for item in items))


def replaced(old: str, new: str, compose: str = GOOD_COMPOSE) -> str:
    assert old in compose
    return compose.replace(old, new)


def of_rule(report: CheckReport, rule: str) -> list[Finding]:
    return [finding for finding in report.findings if finding.rule == rule]


def places(findings: list[Finding]) -> list[tuple[str, int | None, str]]:
    return [(finding.location.file.name, finding.location.line, finding.severity) for finding in findings]


CheckRun = Callable[..., CheckReport]


@pytest.fixture
def run_check(tmp_path: Path) -> CheckRun:
    """Write compose.yaml (and .env) into tmp_path; check them without docker and the shell's variables."""

    def run(
        compose: str = GOOD_COMPOSE,
        env: str | None = GOOD_ENV,
        environ: Mapping[str, str] | None = None,
    ) -> CheckReport:
        (tmp_path / "compose.yaml").write_text(compose)
        if env is not None:
            (tmp_path / ".env").write_text(env)
        return check_deploy([tmp_path / "compose.yaml"], environ=environ or {}, compose_config=False)

    return run


# --- the shipped files and the baseline ----------------------------------------------------------------


def test_the_shipped_spark_compose_with_its_env_example_has_no_findings() -> None:
    report = check_deploy(
        [SPARK_DIR / "compose.yaml"], env_file=SPARK_DIR / ".env.example", environ={}, compose_config=False
    )

    assert report.findings == ()


def test_the_shipped_spark_folder_without_env_is_resolved_from_env_example_with_a_warning_only() -> None:
    report = check_deploy([SPARK_DIR / "compose.yaml"], environ={}, compose_config=False)

    assert report.errors == 0
    assert [(f.rule, f.location.file.name) for f in report.findings] == [("env-file", ".env.example")]


def test_the_test_baseline_compose_has_no_findings(run_check: CheckRun) -> None:
    assert run_check().findings == ()


# --- duplicate-key, duplicate-flag, unquoted-number, command-syntax --------------------------------------


def test_a_key_given_twice_in_a_mapping_is_an_error_at_both_lines(run_check: CheckRun) -> None:
    compose = replaced(
        "    image: modgate-gateway:local\n",
        "    image: modgate-gateway:local\n    image: modgate-gateway:other\n",
    )

    [finding] = of_rule(run_check(compose), "duplicate-key")

    assert finding.severity == "error"
    assert finding.location.line == line_of(compose, "modgate-gateway:other")
    assert finding.related == (Location(finding.location.file, line_of(compose, "modgate-gateway:local")),)


def test_a_flag_repeated_in_a_command_list_is_an_error_reporting_both_lines(run_check: CheckRun) -> None:
    compose = with_items('"--max-num-seqs"', '"16"')

    [finding] = of_rule(run_check(compose), "duplicate-flag")

    assert places([finding]) == [("compose.yaml", line_of(compose, '"--max-num-seqs"', 2), "error")]
    assert [place.line for place in finding.related] == [line_of(compose, '"--max-num-seqs"', 1)]
    assert "'16'" in finding.message
    assert "'8'" in finding.message


def test_a_flag_repeated_in_a_command_string_is_reported_at_each_flags_own_line(run_check: CheckRun) -> None:
    compose = replaced(
        GOOD_COMPOSE[GOOD_COMPOSE.index("    command:\n") : GOOD_COMPOSE.index("    environment:\n")],
        "    command: >\n"
        "      some/model --gpu-memory-utilization ${GPU_MEM_UTIL}\n"
        "      --max-num-seqs 8 --enable-prompt-tokens-details\n"
        "      --scheduling-policy priority --enable-prefix-caching\n"
        "      --max-num-seqs 4\n",
    )

    [finding] = of_rule(run_check(compose), "duplicate-flag")

    assert finding.location.line == line_of(compose, "--max-num-seqs 4")
    assert [place.line for place in finding.related] == [line_of(compose, "--max-num-seqs 8")]


def test_a_switch_and_its_no_form_count_as_one_repeated_flag(run_check: CheckRun) -> None:
    compose = with_items('"--no-enable-prefix-caching"')

    [finding] = of_rule(run_check(compose), "duplicate-flag")

    assert finding.location.line == line_of(compose, "--no-enable-prefix-caching")


def test_an_underscore_spelling_of_a_flag_counts_as_a_repeat(run_check: CheckRun) -> None:
    compose = with_items('"--max_num_seqs=16"')

    [finding] = of_rule(run_check(compose), "duplicate-flag")

    assert finding.location.line == line_of(compose, "--max_num_seqs=16")


def test_an_unquoted_integer_in_a_command_list_is_an_error_at_its_line(run_check: CheckRun) -> None:
    compose = replaced('      - "8"\n', "      - 8\n")

    assert places(of_rule(run_check(compose), "unquoted-number")) == [
        ("compose.yaml", line_of(compose, "      - 8"), "error")
    ]


def test_an_unquoted_float_in_a_command_list_is_an_error_at_its_line(run_check: CheckRun) -> None:
    compose = with_items('"--max-model-len"', '"4096"', '"--kv-cache-memory-fraction"', "0.5")

    assert places(of_rule(run_check(compose), "unquoted-number")) == [
        ("compose.yaml", line_of(compose, "- 0.5"), "error")
    ]


def test_an_unquoted_number_in_a_healthcheck_test_list_is_an_error(run_check: CheckRun) -> None:
    compose = GOOD_COMPOSE + '    healthcheck:\n      test: ["CMD", "sleep", 1]\n'

    assert places(of_rule(run_check(compose), "unquoted-number")) == [
        ("compose.yaml", line_of(compose, '"sleep", 1'), "error")
    ]


def test_a_command_string_with_an_unbalanced_quote_is_an_error(run_check: CheckRun) -> None:
    compose = GOOD_COMPOSE + '  redis:\n    image: redis:7.4-alpine\n    command: redis-server --save "60 1\n'

    assert places(of_rule(run_check(compose), "command-syntax")) == [
        ("compose.yaml", line_of(compose, "redis-server"), "error")
    ]


# --- interpolation and .env --------------------------------------------------------------------------


def test_a_required_variable_missing_from_env_is_an_error_at_its_line(run_check: CheckRun) -> None:
    compose = replaced('"some/model"', '"${MODEL:?set MODEL in .env}"')

    [finding] = of_rule(run_check(compose), "interpolation")

    assert places([finding]) == [("compose.yaml", line_of(compose, "MODEL:?"), "error")]
    assert "set MODEL in .env" in finding.message


def test_an_unset_plain_variable_is_a_warning(run_check: CheckRun) -> None:
    compose = replaced("image: modgate-gateway:local", "image: ${GATEWAY_IMAGE}")

    assert places(of_rule(run_check(compose), "interpolation")) == [
        ("compose.yaml", line_of(compose, "GATEWAY_IMAGE"), "warning")
    ]


def test_a_default_covers_a_variable_missing_from_env(run_check: CheckRun) -> None:
    compose = replaced("image: modgate-gateway:local", "image: ${GATEWAY_IMAGE:-modgate-gateway:local}")

    assert run_check(compose).findings == ()


@pytest.mark.parametrize(
    "line",
    [
        "GPU_MEM_UTIL=0.822 # shared by both settings",
        'export GPU_MEM_UTIL="0.822"  # shared by both settings',
        "GPU_MEM_UTIL='0.822'",
        "BASE=0.822\nGPU_MEM_UTIL=${BASE}",
    ],
)
def test_env_values_may_be_exported_quoted_commented_or_built_from_earlier_ones(
    run_check: CheckRun, line: str
) -> None:
    assert run_check(env=line + "\n").findings == ()


def test_a_env_line_without_an_equals_sign_is_an_error_at_its_line(run_check: CheckRun) -> None:
    report = run_check(env="# tuned\nGPU_MEM_UTIL=0.822\nMAX_SEQS 8\n")

    assert places(of_rule(report, "env-file")) == [(".env", 3, "error")]


# --- memory fraction -----------------------------------------------------------------------------------


def test_gpu_memory_utilization_differing_from_the_alloc_conf_fraction_is_an_error(
    run_check: CheckRun,
) -> None:
    compose = replaced("per_process_memory_fraction:${GPU_MEM_UTIL}", "per_process_memory_fraction:0.8")

    [finding] = of_rule(run_check(compose), "memory-fraction-mismatch")

    assert places([finding]) == [("compose.yaml", line_of(compose, '"${GPU_MEM_UTIL}"'), "error")]
    assert Location(finding.location.file, line_of(compose, "PYTORCH_ALLOC_CONF")) in finding.related


def test_the_memory_fractions_are_compared_after_resolving_defaults_and_env(run_check: CheckRun) -> None:
    compose = replaced('"${GPU_MEM_UTIL}"', '"${ENGINE_UTIL:-0.9}"')

    [finding] = of_rule(run_check(compose, env="GPU_MEM_UTIL=0.822\n"), "memory-fraction-mismatch")

    assert "0.9" in finding.message
    assert "0.822" in finding.message
    assert Location(finding.location.file.parent / ".env", 1) in finding.related


def test_the_shell_environment_overrides_env_when_comparing_memory_fractions(run_check: CheckRun) -> None:
    compose = replaced('"${GPU_MEM_UTIL}"', '"${ENGINE_UTIL:-0.822}"')

    report = run_check(compose, environ={"ENGINE_UTIL": "0.85"})

    assert places(of_rule(report, "memory-fraction-mismatch")) == [
        ("compose.yaml", line_of(compose, "ENGINE_UTIL"), "error")
    ]


def test_equal_memory_fractions_written_differently_pass(run_check: CheckRun) -> None:
    compose = replaced(
        "per_process_memory_fraction:${GPU_MEM_UTIL}",
        "expandable_segments:True,per_process_memory_fraction:0.8220",
    )

    assert of_rule(run_check(compose), "memory-fraction-mismatch") == []


def test_gpu_memory_utilization_without_an_alloc_conf_fraction_is_a_warning(run_check: CheckRun) -> None:
    compose = replaced(
        '      PYTORCH_ALLOC_CONF: "per_process_memory_fraction:${GPU_MEM_UTIL}"\n', '      OTHER: "1"\n'
    )

    assert places(of_rule(run_check(compose), "memory-fraction-mismatch")) == [
        ("compose.yaml", line_of(compose, '"--gpu-memory-utilization"'), "warning")
    ]


# --- engine tuning -------------------------------------------------------------------------------------


def test_a_speculative_config_is_an_error_at_its_line(run_check: CheckRun) -> None:
    compose = with_items('"--speculative-config"', """'{"method": "mtp", "num_speculative_tokens": 4}'""")

    [finding] = of_rule(run_check(compose), "speculative-decoding")

    assert places([finding]) == [("compose.yaml", line_of(compose, "--speculative-config"), "error")]
    assert "MTP" in finding.message


def test_num_speculative_tokens_is_an_error_at_its_line(run_check: CheckRun) -> None:
    compose = with_items('"--num-speculative-tokens=4"')

    assert places(of_rule(run_check(compose), "speculative-decoding")) == [
        ("compose.yaml", line_of(compose, "--num-speculative-tokens"), "error")
    ]


@pytest.mark.parametrize(
    "knob",
    ["--long-prefill-token-threshold", "--max-num-partial-prefills", "--max-long-partial-prefills"],
)
def test_a_prefill_scheduling_knob_is_a_warning_at_its_line(run_check: CheckRun, knob: str) -> None:
    compose = with_items(f'"{knob}"', '"2"')

    assert places(of_rule(run_check(compose), "prefill-scheduling")) == [
        ("compose.yaml", line_of(compose, knob), "warning")
    ]


def test_turning_chunked_prefill_off_is_a_prefill_scheduling_warning(run_check: CheckRun) -> None:
    compose = with_items('"--no-enable-chunked-prefill"')

    assert places(of_rule(run_check(compose), "prefill-scheduling")) == [
        ("compose.yaml", line_of(compose, "--no-enable-chunked-prefill"), "warning")
    ]


USE_PRIORITY = '      MODGATE_ENGINE__USE_PRIORITY: "true"\n'


def sending_priorities(compose: str = GOOD_COMPOSE, line: str = USE_PRIORITY) -> str:
    """The compose with the gateway turning use_priority on (it then sends each request's priority)."""
    cap = '      MODGATE_ENGINE__MAX_INFLIGHT: "8"\n'
    return replaced(cap, cap + line, compose)


WITHOUT_POLICY = '      - "--scheduling-policy"\n      - "priority"\n'


def test_a_missing_scheduling_policy_passes_while_the_gateway_sends_no_priority(run_check: CheckRun) -> None:
    compose = replaced(WITHOUT_POLICY, "")

    assert run_check(compose).findings == ()


def test_fcfs_passes_while_the_gateway_sends_no_priority(run_check: CheckRun) -> None:
    compose = replaced('      - "priority"\n', '      - "fcfs"\n')

    assert run_check(compose).findings == ()


def test_a_missing_scheduling_policy_is_an_error_at_the_command_when_the_gateway_sends_priorities(
    run_check: CheckRun,
) -> None:
    compose = sending_priorities(replaced(WITHOUT_POLICY, ""))

    [finding] = of_rule(run_check(compose), "scheduling-policy")

    assert places([finding]) == [("compose.yaml", line_of(compose, "command:") + 1, "error")]
    assert [place.line for place in finding.related] == [line_of(compose, "USE_PRIORITY")]
    assert "MODGATE_ENGINE__USE_PRIORITY" in finding.message


def test_fcfs_is_an_error_when_the_gateway_sends_priorities(run_check: CheckRun) -> None:
    compose = sending_priorities(replaced('      - "priority"\n', '      - "fcfs"\n'))

    [finding] = of_rule(run_check(compose), "scheduling-policy")

    assert places([finding]) == [("compose.yaml", line_of(compose, "--scheduling-policy"), "error")]
    assert "--scheduling-policy priority" in finding.message


def test_priority_scheduling_with_a_gateway_sending_priorities_passes(run_check: CheckRun) -> None:
    assert run_check(sending_priorities()).findings == ()


@pytest.mark.parametrize("value", ["1", "yes", "on", "True", "t"])
def test_use_priority_is_read_as_pydantic_reads_a_boolean(run_check: CheckRun, value: str) -> None:
    compose = sending_priorities(
        replaced(WITHOUT_POLICY, ""), f'      modgate_engine__use_priority: "{value}"\n'
    )

    assert places(of_rule(run_check(compose), "scheduling-policy")) == [
        ("compose.yaml", line_of(compose, "command:") + 1, "error")
    ]


@pytest.mark.parametrize("value", ["false", "0", "off"])
def test_use_priority_off_requires_no_priority_scheduling(run_check: CheckRun, value: str) -> None:
    compose = sending_priorities(
        replaced(WITHOUT_POLICY, ""), f'      MODGATE_ENGINE__USE_PRIORITY: "{value}"\n'
    )

    assert run_check(compose).findings == ()


@pytest.mark.parametrize("value", ["sometimes", ""])
def test_a_use_priority_value_that_is_not_a_boolean_is_an_error_at_its_line(
    run_check: CheckRun, value: str
) -> None:
    compose = sending_priorities(line=f'      MODGATE_ENGINE__USE_PRIORITY: "{value}"\n')

    [finding] = of_rule(run_check(compose), "scheduling-policy")

    assert places([finding]) == [("compose.yaml", line_of(compose, "USE_PRIORITY"), "error")]
    assert "not a boolean" in finding.message


def test_priority_scheduling_is_required_only_of_the_engines_the_priority_gateway_names(
    run_check: CheckRun,
) -> None:
    second_engine = (
        GOOD_COMPOSE.split("  gateway:\n")[0].split("services:\n")[1].replace("  vllm:", "  vllm-b:")
    )
    second_engine = replaced(WITHOUT_POLICY, "", second_engine)
    compose = replaced("  gateway:\n", second_engine + "  gateway:\n")
    compose = sending_priorities(compose)
    compose = replaced('"http://vllm:8000"', '"http://vllm:8000,http://vllm-b:8000"', compose)
    compose += '  batch-gateway:\n    environment:\n      MODGATE_ENGINE__URL: "http://vllm-b:8000"\n'

    [finding] = of_rule(run_check(compose), "scheduling-policy")

    assert finding.location.line == line_of(compose, "command:", 2) + 1  # vllm-b's; vllm has priority


def test_a_scheduling_policy_vllm_does_not_know_is_an_error(run_check: CheckRun) -> None:
    compose = replaced('      - "priority"\n', '      - "sjf"\n')

    [finding] = of_rule(run_check(compose), "scheduling-policy")

    assert "'sjf'" in finding.message


def test_a_missing_enable_prompt_tokens_details_is_an_error_at_the_command(run_check: CheckRun) -> None:
    compose = replaced('      - "--enable-prompt-tokens-details"\n', "")

    assert places(of_rule(run_check(compose), "prompt-tokens-details")) == [
        ("compose.yaml", line_of(compose, "command:") + 1, "error")
    ]


# --- mamba block size ----------------------------------------------------------------------------------


def test_a_mamba_block_size_not_a_multiple_of_8_is_an_error_at_its_value(run_check: CheckRun) -> None:
    compose = with_items('"--mamba-block-size"', '"2960"', '"--mamba-cache-mode"', '"all"')
    compose = replaced('"2960"', '"2961"', compose)

    assert places(of_rule(run_check(compose), "mamba-block-size")) == [
        ("compose.yaml", line_of(compose, '"2961"'), "error")
    ]


def test_a_mamba_block_size_off_the_16_token_kernel_alignment_is_a_realignment_warning(
    run_check: CheckRun,
) -> None:
    compose = with_items('"--mamba-block-size"', '"2952"', '"--mamba-cache-mode"', '"all"')

    [finding] = of_rule(run_check(compose), "mamba-block-size")

    assert places([finding]) == [("compose.yaml", line_of(compose, '"2952"'), "warning")]
    assert "5904" in finding.message  # lcm(2952, 16)


def test_a_16_aligned_mamba_block_size_in_mode_all_passes(run_check: CheckRun) -> None:
    compose = with_items('"--mamba-block-size"', '"2960"', '"--mamba-cache-mode"', '"all"')

    assert of_rule(run_check(compose), "mamba-block-size") == []


def test_a_mamba_block_size_in_align_mode_is_a_warning_that_it_is_replaced(run_check: CheckRun) -> None:
    compose = with_items('"--mamba-block-size"', '"2960"', '"--mamba-cache-mode"', '"align"')

    [finding] = of_rule(run_check(compose), "mamba-block-size")

    assert finding.severity == "warning"
    assert "attention block size" in finding.message


def test_a_mamba_block_size_without_prefix_caching_is_a_warning(run_check: CheckRun) -> None:
    compose = replaced(
        '      - "--enable-prefix-caching"\n', '      - "--mamba-block-size"\n      - "2960"\n'
    )

    assert places(of_rule(run_check(compose), "mamba-block-size")) == [
        ("compose.yaml", line_of(compose, '"2960"'), "warning")
    ]


# --- gateway against engine ----------------------------------------------------------------------------


def test_max_inflight_above_the_engines_max_num_seqs_is_an_error_at_both_lines(run_check: CheckRun) -> None:
    compose = replaced('MODGATE_ENGINE__MAX_INFLIGHT: "8"', 'MODGATE_ENGINE__MAX_INFLIGHT: "12"')

    [finding] = of_rule(run_check(compose), "max-inflight")

    assert places([finding]) == [("compose.yaml", line_of(compose, "MODGATE_ENGINE__MAX_INFLIGHT"), "error")]
    assert [place.line for place in finding.related] == [line_of(compose, '      - "8"')]


def test_the_default_max_inflight_of_8_is_checked_when_the_gateway_leaves_it_unset(
    run_check: CheckRun,
) -> None:
    compose = replaced('      MODGATE_ENGINE__MAX_INFLIGHT: "8"\n', "")
    compose = replaced('      - "8"\n', '      - "4"\n', compose)

    [finding] = of_rule(run_check(compose), "max-inflight")

    assert "default" in finding.message
    assert finding.location.line == line_of(compose, "  gateway:")


def test_max_inflight_is_compared_with_the_engine_its_url_names(run_check: CheckRun) -> None:
    second_engine = (
        GOOD_COMPOSE.split("  gateway:\n")[0].split("services:\n")[1].replace("  vllm:", "  vllm-small:")
    )
    second_engine = second_engine.replace('      - "8"\n', '      - "2"\n')
    compose = replaced("  gateway:\n", second_engine + "  gateway:\n")
    compose = replaced("http://vllm:8000", "http://vllm-small:8000", compose)

    [finding] = of_rule(run_check(compose), "max-inflight")

    assert "vllm-small" in finding.message


# --- several compose files ----------------------------------------------------------------------------


def test_an_override_file_is_merged_and_its_findings_name_that_file(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(GOOD_COMPOSE)
    (tmp_path / ".env").write_text(GOOD_ENV)
    override = 'services:\n  gateway:\n    environment:\n      MODGATE_ENGINE__MAX_INFLIGHT: "9"\n'
    (tmp_path / "compose.override.yaml").write_text(override)

    report = check_deploy(
        [tmp_path / "compose.yaml", tmp_path / "compose.override.yaml"], environ={}, compose_config=False
    )

    assert places(of_rule(report, "max-inflight")) == [("compose.override.yaml", 4, "error")]


def test_services_built_from_a_yaml_anchor_are_checked_at_the_anchors_lines(run_check: CheckRun) -> None:
    engine = GOOD_COMPOSE.split("  vllm:\n")[1].split("  gateway:\n")[0]
    compose = (
        "x-engine: &engine\n"
        + engine.replace('      - "8"\n', '      - "8"\n      - "--max-num-seqs"\n      - "6"\n')
        + "services:\n  vllm:\n    <<: *engine\n  gateway:\n"
        + GOOD_COMPOSE.split("  gateway:\n")[1]
    )

    [finding] = of_rule(run_check(compose), "duplicate-flag")

    assert finding.location.line == line_of(compose, '"--max-num-seqs"', 2)


# --- unreadable input ----------------------------------------------------------------------------------


def test_invalid_yaml_is_unreadable_input_naming_the_line(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text('services:\n  vllm:\n    command: ["a"\n  redis: {}\n')

    with pytest.raises(UnreadableInputError, match=r"compose\.yaml:\d+: not valid YAML"):
        check_deploy([tmp_path / "compose.yaml"], environ={}, compose_config=False)


def test_a_compose_file_without_services_is_unreadable_input(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("volumes:\n  data:\n")

    with pytest.raises(UnreadableInputError, match="services"):
        check_deploy([tmp_path / "compose.yaml"], environ={}, compose_config=False)


def test_a_vllm_engine_without_a_queue_backstop_is_told_the_value_and_why(run_check: CheckRun) -> None:
    compose = GOOD_COMPOSE.replace('      - "--max-num-queued-reqs"\n      - "16"\n', "")

    [finding] = of_rule(run_check(compose), "queue-backstop")

    assert finding.severity == "warning"
    assert "add `--max-num-queued-reqs 16` (above MODGATE_ENGINE__MAX_INFLIGHT 8" in finding.message
    assert "with Redis away each gateway replica caps" in finding.message
    assert "back-pressure" in finding.message


def test_a_queue_backstop_at_the_gateways_cap_binds_under_it_and_is_a_warning(run_check: CheckRun) -> None:
    compose = GOOD_COMPOSE.replace('      - "16"\n    environment:', '      - "8"\n    environment:')

    [finding] = of_rule(run_check(compose), "queue-backstop")

    assert "--max-num-queued-reqs 8 of `vllm` is not above MODGATE_ENGINE__MAX_INFLIGHT 8" in finding.message
    assert "about 16" in finding.message

# --- prefix match unit ---------------------------------------------------------------------------------


HYBRID_COMPOSE = replaced('"some/model"', '"Qwen/Qwen3-Next-80B-A3B-Instruct"')


def test_a_hybrid_model_without_a_match_unit_is_told_to_add_one(run_check: CheckRun) -> None:
    findings = of_rule(run_check(HYBRID_COMPOSE), "prefix-match-unit")
    assert [f.severity for f in findings] == ["warning"]
    assert "--prefix-match-unit 16" in findings[0].message


def test_a_match_unit_of_16_on_a_hybrid_model_passes(run_check: CheckRun) -> None:
    compose = with_items('"--prefix-match-unit"', '"16"', compose=HYBRID_COMPOSE)
    assert of_rule(run_check(compose), "prefix-match-unit") == []


@pytest.mark.parametrize(("items", "words"), [
    (('"--prefix-match-unit"', '"100"', '"--block-size"', '"2176"'), "does not divide --block-size 2176"),
    (('"--prefix-match-unit"', '"64"'), "guarantees only a multiple of 16"),
    (('"--prefix-match-unit"', '"0"'), "must be a positive integer"),
    (('"--prefix-match-unit"', '"16"', '"--mamba-cache-mode"', '"all"'), "--mamba-cache-mode all"),
    (('"--prefix-match-unit"', '"16"', '"--no-enable-prefix-caching"'), "--no-enable-prefix-caching"),
])
def test_a_match_unit_vllm_refuses_or_ignores_is_an_error_before_a_start(
    run_check: CheckRun, items: tuple[str, ...], words: str
) -> None:
    compose = with_items(*items, compose=HYBRID_COMPOSE)
    if "--no-enable-prefix-caching" in " ".join(items):
        compose = compose.replace('      - "--enable-prefix-caching"\n', "")
    findings = of_rule(run_check(compose), "prefix-match-unit")
    assert [f.severity for f in findings] == ["error"], findings
    assert words in findings[0].message
    assert findings[0].location.line == line_of(compose, items[1])


def test_a_match_unit_on_a_plain_model_is_a_warning(run_check: CheckRun) -> None:
    findings = of_rule(run_check(with_items('"--prefix-match-unit"', '"16"')), "prefix-match-unit")
    assert [f.severity for f in findings] == ["warning"]
    assert "one KV cache group" in findings[0].message
