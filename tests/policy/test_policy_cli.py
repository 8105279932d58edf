"""``modgate policy show|set|rollback|history|audit`` against a running gateway."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from bench.servers import free_port
from cli.embedded import ThreadedServer
from cli.main import app
from tests.support import ADMIN_TOKEN, GatewayFactory

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def modgate(gateway: ThreadedServer, *args: str, token: str | None = ADMIN_TOKEN) -> Result:
    """``modgate policy <args> --url <gateway>`` with the admin token in the environment."""
    env = {"MODGATE_AUTH__ADMIN_TOKEN": token or "", "USER": "alice"}
    return CliRunner().invoke(app, ["policy", *args, "--url", gateway.url], env=env)


def served_policy(gateway: ThreadedServer) -> dict[str, object]:
    """What the gateway itself says is in force."""
    document: dict[str, object] = httpx.get(f"{gateway.url}/admin/thinking-policy", headers=ADMIN).json()
    return document


def test_show_prints_the_version_hash_and_settings(gateway: ThreadedServer) -> None:
    result = modgate(gateway, "show")
    assert result.exit_code == 0, result.output
    assert "version 1" in result.output
    assert served_policy(gateway)["content_hash"] in result.output
    assert "default_mode" in result.output
    assert "store memory available" in result.output


def test_set_flips_the_mode_and_prints_what_changed(gateway: ThreadedServer) -> None:
    result = modgate(gateway, "set", "--default-mode", "off", "--reason", "evening peak")
    assert result.exit_code == 0, result.output
    assert "version 1 → 2" in result.output
    assert "default_mode" in result.output
    shown = served_policy(gateway)
    assert (shown["version"], shown["default_mode"], shown["reason"]) == (2, "off", "evening peak")
    assert str(shown["updated_by"]).startswith("alice (admin:")


def test_set_without_a_reason_is_a_usage_error(gateway: ThreadedServer) -> None:
    result = modgate(gateway, "set", "--default-mode", "off")
    assert result.exit_code == 2
    assert served_policy(gateway)["version"] == 1


def test_set_with_nothing_to_change_says_so(gateway: ThreadedServer) -> None:
    assert modgate(gateway, "set", "--reason", "nothing").exit_code == 2
    same = modgate(gateway, "set", "--default-mode", "on", "--reason", "already on")
    assert same.exit_code == 0, same.output
    assert "no change" in same.output
    assert served_policy(gateway)["version"] == 1


def test_set_takes_rules_from_a_yaml_file(gateway: ThreadedServer, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "default_mode: off\n"
        "rules:\n"
        "  - name: appeals\n"
        "    tags: [appeal]\n"
        "    mode: on\n"
        "    keep_under_load: true\n"
        "load:\n"
        "  enabled: true\n"
        "  queue_depth_high: 16\n"
        "  queue_depth_low: 4\n"
    )
    result = modgate(gateway, "set", "--file", str(rules), "--reason", "appeals keep thinking")
    assert result.exit_code == 0, result.output
    shown = served_policy(gateway)
    assert shown["default_mode"] == "off"
    assert shown["rules"] == [
        {
            "name": "appeals",
            "tenants": [],
            "tags": ["appeal"],
            "priority_at_least": None,
            "priority_at_most": None,
            "mode": "on",
            "allow_caller_choice": None,
            "keep_under_load": True,
        }
    ]
    shown_text = modgate(gateway, "show").output
    assert "appeals" in shown_text
    assert "queue depth off above 16, on below 4" in shown_text


def test_set_refuses_an_invalid_file_before_calling_the_gateway(
    gateway: ThreadedServer, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"default_mode": "sometimes"}))
    result = modgate(gateway, "set", "--file", str(bad), "--reason", "typo")
    assert result.exit_code == 2
    assert "default_mode" in result.output
    assert served_policy(gateway)["version"] == 1


def test_a_dry_run_shows_the_change_and_makes_none(gateway: ThreadedServer) -> None:
    result = modgate(gateway, "set", "--shadow-share", "0.1", "--dry-run", "--reason", "look first")
    assert result.exit_code == 0, result.output
    assert "shadow_share" in result.output
    assert served_policy(gateway)["version"] == 1


def test_history_audit_and_rollback_read_back_the_flips(gateway: ThreadedServer) -> None:
    assert modgate(gateway, "set", "--default-mode", "off", "--reason", "evening peak").exit_code == 0
    assert modgate(gateway, "set", "--max-tokens-off", "32", "--reason", "shorter").exit_code == 0
    rolled = modgate(gateway, "rollback", "--to", "1", "--reason", "peak is over")
    assert rolled.exit_code == 0, rolled.output
    assert "version 3 → 4" in rolled.output
    restored = served_policy(gateway)
    assert (restored["default_mode"], restored["max_completion_tokens_off"]) == ("on", 64)
    history = modgate(gateway, "history")
    assert history.exit_code == 0, history.output
    assert re.findall(r"^│ (\d+) ", history.output, flags=re.MULTILINE) == ["4", "3", "2", "1"]
    audit = modgate(gateway, "audit", "--json")
    entries = json.loads(audit.output)
    assert [(e["action"], e["reason"]) for e in entries] == [
        ("rollback", "peak is over"),
        ("set", "shorter"),
        ("set", "evening peak"),
    ]
    assert entries[2]["changes"] == {"default_mode": {"old": "on", "new": "off"}}
    table = modgate(gateway, "audit").output
    assert "default_mode: on → off" in table


def test_without_a_token_the_command_says_how_to_give_one(gateway: ThreadedServer) -> None:
    result = modgate(gateway, "show", token=None)
    assert result.exit_code == 2
    assert "MODGATE_AUTH__ADMIN_TOKEN" in result.output


def test_a_refused_token_prints_the_gateways_reason_and_changes_nothing(gateway: ThreadedServer) -> None:
    result = modgate(
        gateway, "set", "--default-mode", "off", "--reason", "x y z", token="not-the-token-at-all"
    )
    assert result.exit_code == 1
    assert "401" in result.output
    assert "invalid admin token" in result.output
    assert served_policy(gateway)["version"] == 1


def test_a_flip_while_redis_is_unreachable_prints_the_503(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    shown = modgate(gateway, "show")
    assert "UNAVAILABLE" in shown.output
    result = modgate(gateway, "set", "--default-mode", "off", "--reason", "during the outage")
    assert result.exit_code == 1
    assert "503 policy_store_unavailable" in result.output
    assert served_policy(gateway)["default_mode"] == "on"


@pytest.mark.parametrize("command", ["show", "history", "audit"])
def test_an_unreachable_gateway_is_a_readable_error(command: str) -> None:
    env = {"MODGATE_AUTH__ADMIN_TOKEN": ADMIN_TOKEN}
    result = CliRunner().invoke(app, ["policy", command, "--url", f"http://127.0.0.1:{free_port()}"], env=env)
    assert result.exit_code == 1
    assert "cannot reach the gateway" in result.output


def test_reasons_are_printed_as_written_brackets_and_all(gateway: ThreadedServer) -> None:
    reason = "[/urgent] [bold]evening peak"
    assert modgate(gateway, "set", "--default-mode", "off", "--reason", reason).exit_code == 0
    shown = modgate(gateway, "show")
    assert shown.exit_code == 0, shown.output
    assert reason in shown.output
