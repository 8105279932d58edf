"""A flip to ``escalate`` through the admin API or the console is in force on every replica."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.embedded import ThreadedServer
from tests.console.test_console_access import flip, signed_in
from tests.policy.test_policy_replicas import (
    ADMIN,
    moderation_details,
    policy_of,
    put_policy,
    replicas,
    within_flip_deadline,
)
from tests.processes import GatewayProcessesFactory
from tests.support import GatewayFactory


def escalated_on(url: str, version: int) -> bool:
    """The replica shows ``version`` and escalates an unsure frame under it."""
    if policy_of(url)["version"] != version:
        return False
    details: dict[str, Any] = moderation_details(url, seed=version)
    return (details["policy_version"], details["thinking_mode"], details["thinking_rule"]) == (
        version,
        "escalate",
        "escalated",
    )


@pytest.mark.redis
def test_a_flip_to_escalate_through_one_gateway_is_in_force_on_the_other_within_a_second(
    redis_url: str, sim: ThreadedServer, gateway_processes: GatewayProcessesFactory
) -> None:
    first, second = replicas(gateway_processes, 2, sim.url, redis_url, MODGATE_POLICY__RELOAD_INTERVAL_S="60")
    flipped = put_policy(
        first, default_mode="escalate", escalation={"threshold": 1.0}, reason="think only where unsure"
    )
    assert flipped.status_code == 200, flipped.text
    within_flip_deadline(lambda: escalated_on(second, 2), "the flip to escalate")
    shown = policy_of(second)
    assert shown["escalation"]["threshold"] == 1.0
    audit = httpx.get(f"{second}/admin/audit", headers=ADMIN, timeout=5).json()["data"]
    assert audit[0]["changes"] == {
        "default_mode": {"old": "on", "new": "escalate"},
        "escalation.threshold": {"old": 0.85, "new": 1.0},
    }
    # and a threshold nobody's fast verdict is below: the other replica answers fast under version 3
    assert put_policy(second, escalation={**shown["escalation"], "threshold": 0.0}).status_code == 200
    within_flip_deadline(
        lambda: moderation_details(first, seed=3)["thinking"] == "off", "the threshold change"
    )


def test_a_bad_escalation_field_is_refused_with_a_clear_422(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    refused = put_policy(gateway.url, default_mode="escalate", escalation={"always_categories": ["gore"]})
    # 422, as every policy the schema admits but a rule between its values refuses (docs/api.md)
    assert refused.status_code == 422, refused.text
    assert "gore" in refused.json()["error"]["message"]
    assert policy_of(gateway.url)["version"] == 1


@pytest.mark.redis
def test_the_console_flips_to_escalate_on_every_replica(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, tmp_path: Path
) -> None:
    first, second = (
        start_gateway(engine_url=sim.url, redis_url=redis_url, console={"reports_dir": str(tmp_path)})
        for _ in range(2)
    )
    cookie, csrf = signed_in(first)
    page = httpx.get(f"{first.url}/console", headers={"Cookie": cookie}).text
    assert re.search(r'name="mode" value="escalate"', page)
    flipped = flip(first, cookie, mode="escalate", reason="think only where unsure", version="1", csrf=csrf)
    assert flipped.status_code == 303, flipped.text
    within_flip_deadline(lambda: policy_of(second.url)["default_mode"] == "escalate", "the console flip")
    panels = httpx.get(f"{second.url}/console/panels", headers=ADMIN, timeout=10).json()["panels"]
    assert 'id="tile-escalation"' in panels["summary"]
    assert "below 0.85" in panels["policy"]
