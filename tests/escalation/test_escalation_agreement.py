"""Escalation's agreement with thinking on, measured through the gateway on the simulator, against what the
simulator's assumed separation and flip share imply in closed form (bench/escalation_agreement.py)."""

from __future__ import annotations

import asyncio
import math
from statistics import NormalDist

import httpx
import pytest

from bench.escalation_agreement import (
    AgreementRun,
    FrameOutcome,
    expected_agreement,
    expected_escalated,
    measure,
    print_run,
    summarise,
    wilson,
)
from deploy.simulator.presets import PRESETS
from tests.support import ADMIN_TOKEN, GatewayFactory, SimFactory

FRAMES = 500  # at 99 % the 95 % Wilson interval is about [97.7, 99.6]; at 97 %, [95.1, 98.2]
SPARK = PRESETS["spark"]


def outcomes_at(
    start_sim: SimFactory, start_gateway: GatewayFactory, frames: int, threshold: float
) -> list[FrameOutcome]:
    """``frames`` labelled keyframes through a gateway escalating below ``threshold`` on the Spark preset."""
    sim = start_sim("spark", time_scale=0.0)  # agreement does not depend on time
    gateway = start_gateway(engine={"url": sim.url}, shaping={"verdict_cache_ttl_s": 0})  # every answer asked

    async def go() -> list[FrameOutcome]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as http:
            return await measure(http, frames, threshold, admin_token=ADMIN_TOKEN, size=(160, 90))

    return asyncio.run(go())


def at(outcomes: list[FrameOutcome], threshold: float, ran_at: float) -> AgreementRun:
    return summarise(outcomes, threshold, ran_at, separation=SPARK.separation_auroc,
                     disagreement=SPARK.thinking_off_disagreement)


def test_the_closed_form_is_the_binormal_arithmetic_at_the_presets_numbers() -> None:
    # by hand, at the preset's 0.85 and 6 %: mu = sqrt 2 Phi^-1(0.85) = 1.4657; at T = 0.97 the fast
    # confidence 1/3 + 2/3 Phi(2 - s) >= T where s <= 2 - Phi^-1(0.955) = 0.3044; a flip stands with
    # probability Phi(0.3044 - 1.4657) = 0.1228, so agreement is 1 - 0.06 x 0.1228 = 0.99263
    normal = NormalDist()
    mu = math.sqrt(2) * normal.inv_cdf(0.85)
    cut = 2 - normal.inv_cdf((3 * 0.97 - 1) / 2)
    assert expected_agreement(0.97, 0.85, 0.06) == pytest.approx(1 - 0.06 * normal.cdf(cut - mu))
    assert expected_agreement(0.97, 0.85, 0.06) == pytest.approx(0.99263, abs=5e-5)
    assert expected_agreement(0.0, 0.85, 0.06) == pytest.approx(0.94)  # nothing escalates: the 6 % stand
    assert expected_agreement(1.0, 0.85, 0.06) == pytest.approx(1.0)  # everything escalates
    assert expected_escalated(1.0, 0.85, 0.06) == pytest.approx(1.0)


@pytest.mark.timeout(900)  # 500 frames, each asked two or three times: minutes on a loaded machine
def test_escalations_measured_agreement_holds_the_presets_expectation_within_its_interval(
    start_sim: SimFactory, start_gateway: GatewayFactory,
) -> None:
    outcomes = outcomes_at(start_sim, start_gateway, FRAMES, 0.97)
    run, lower = at(outcomes, 0.97, 0.97), at(outcomes, 0.8, 0.97)
    print()
    print_run(run)
    print_run(lower)
    # what the assumptions imply lies inside what was measured, at the threshold the gateway ran
    low, high = run.interval
    assert low <= run.expected_agreement <= high
    # and enough frames to tell 99 % from 97 %: the interval at 0.97 (expected 99.3 %) is above 97 %, the
    # one at 0.8 (expected 97.0 %, decided again from the same fast verdicts) below 99 %
    assert low > 0.97
    assert lower.expected_agreement == pytest.approx(0.970, abs=0.001)
    assert lower.interval[1] < 0.99
    # the fast verdicts differ on about the preset's flip share (6 %): the run saw the assumed model
    f_low, f_high = wilson(run.flipped, run.frames)
    assert f_low <= SPARK.thinking_off_disagreement <= f_high


def test_a_replay_above_the_threshold_the_gateway_ran_is_refused() -> None:
    frame = FrameOutcome(("allow", (), 0.9), ("allow", ()), False, ("allow", ()))
    with pytest.raises(ValueError, match="cannot say"):
        at([frame], 0.95, 0.9)
