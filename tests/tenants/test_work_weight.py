"""The fair share's work weight follows the engine in force: its preset's prefill over decode rate."""

from __future__ import annotations

import pytest

from deploy.simulator import PRESETS
from gateway.cli.main import engine_settings, work_weighed
from gateway.settings import Settings, SimulatorSettings, TenantSettings


def test_the_default_weight_is_the_spark_presets_prefill_over_decode() -> None:
    spark = PRESETS["spark"]
    assert spark.output_token_weight == pytest.approx(
        spark.effective_prefill_tokens_per_s / spark.decode_tokens_per_s
    )
    # rounded to a tenth: change both together when the preset is fitted again
    assert TenantSettings().output_token_weight == pytest.approx(spark.output_token_weight, abs=0.05)


def test_the_built_in_simulator_weighs_output_by_its_own_preset() -> None:
    slower_decode = PRESETS["spark"].scaled(decode_tokens_per_s=50.0)
    assert work_weighed(Settings(), slower_decode).output_token_weight == pytest.approx(66.5)
    settings = Settings(engine_url=None, simulator=SimulatorSettings(preset="spark", time_scale=0))
    with engine_settings(settings) as served:
        assert served.tenants.output_token_weight == pytest.approx(34.0)


def test_a_weight_set_by_the_operator_wins_and_a_preset_without_costs_keeps_the_default() -> None:
    chosen = Settings(tenants=TenantSettings(output_token_weight=10.0))
    assert work_weighed(chosen, PRESETS["spark"]).output_token_weight == 10.0
    default = TenantSettings().output_token_weight
    assert work_weighed(Settings(), PRESETS["instant"]).output_token_weight == default
    assert PRESETS["instant"].output_token_weight is None


def test_the_weight_from_the_environment_counts_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODGATE_TENANTS__OUTPUT_TOKEN_WEIGHT", "12.5")
    assert work_weighed(Settings(), PRESETS["spark"]).output_token_weight == 12.5
