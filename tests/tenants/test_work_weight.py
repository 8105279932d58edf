"""The fair share's work weight follows the engine in force: the built-in simulator's preset's prefill over
decode rate, or learned from the calls of the engine served."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from cli.main import engine_settings, work_weighed
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from gateway.http.app import create_app
from gateway.settings import Settings, SimulatorSettings, TenantSettings
from tests.support import image_input


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


def learned_weight(decode_tokens_per_s: float, **settings: Any) -> float:
    """The gateway's work weight after three thinking-on keyframes on a Spark whose decode rate is given."""
    preset = PRESETS["spark"].scaled(decode_tokens_per_s=decode_tokens_per_s)
    with (
        ThreadedServer(create_sim_app(preset, 1.0)) as sim,
        ThreadedServer(create_app(Settings(engine_url=sim.url, **settings))) as gateway,
    ):
        for seed in range(3):
            frame = image_input(make_keyframe("allow", seed=seed))
            response = httpx.post(f"{gateway.url}/v1/moderations", json={"input": frame},
                                  headers={"X-Modgate-Thinking": "on"}, timeout=60)
            assert response.status_code == 200, response.text
        text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    (weight,) = (sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                 if sample.name == "modgate_tenants_output_token_weight")
    return weight


def test_in_front_of_an_engine_the_weight_is_learned_from_its_calls_not_the_sparks_constant() -> None:
    # Two engines either side of the Spark's 34: decode 400 tokens/s (weight 8.3) and 25 (133). The gateway
    # learns each one's from its calls' prefill and decode times (request overheads make it approximate).
    fast, slow = learned_weight(400.0), learned_weight(25.0)
    fast_weight = PRESETS["spark"].scaled(decode_tokens_per_s=400.0).output_token_weight
    assert fast_weight == pytest.approx(8.3, abs=0.1)
    assert fast < 20 < TenantSettings().output_token_weight < 60 < slow


def test_a_weight_set_by_the_operator_is_not_learned_over() -> None:
    assert learned_weight(400.0, tenants=TenantSettings(output_token_weight=34.0)) == 34.0
