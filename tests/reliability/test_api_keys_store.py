"""API keys kept in Redis as digests only: ``modgate keys add|list|revoke``, read by the gateway at once;
keys in the OpenAI error shape's 401/403, and never in a log line."""

from __future__ import annotations

import hashlib
import logging

import httpx
import pytest
import redis
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app as cli
from deploy.keyframes import make_keyframe
from gateway.http.keys_store import API_KEYS_HASH
from tests.processes import RedisServer
from tests.reliability.conftest import error_body
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

BODY = {"input": image_input(make_keyframe("allow", 320, 180))}


def keys(redis_url: str, *args: str) -> str:
    """Run ``modgate keys …`` against ``redis_url``; answers its standard output."""
    result = CliRunner().invoke(cli, ["keys", *args], env={"MODGATE_REDIS__URL": redis_url})
    assert result.exit_code == 0, result.output
    return result.stdout


def moderate(gateway: ThreadedServer, key: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/moderations", json=BODY, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def test_a_new_key_is_printed_once_and_only_its_digest_is_stored(redis_url: str) -> None:
    key = keys(redis_url, "add", "--tenant", "acme").strip()
    assert key.startswith("mg_")
    assert len(key) > 40
    state = redis.Redis.from_url(redis_url)
    try:
        stored = state.hgetall(API_KEYS_HASH)
        everything = b"".join(k + (state.dump(k) or b"") for k in state.scan_iter())
    finally:
        state.close()
    assert stored == {hashlib.sha256(key.encode()).hexdigest().encode(): b"acme"}
    assert key.encode() not in everything
    listed = keys(redis_url, "list")
    assert "acme" in listed
    assert key not in listed


def test_a_tenant_name_must_be_plain(redis_url: str) -> None:
    env = {"MODGATE_REDIS__URL": redis_url}
    result = CliRunner().invoke(cli, ["keys", "add", "--tenant", "a;b"], env=env)
    assert result.exit_code == 2


def test_a_key_added_with_the_cli_works_at_once_and_stops_working_when_revoked(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = start_gateway(
        engine_url=sim.url,
        redis_url=redis_url,
        api_keys_from_redis=True,
        api_keys="settings-key-123:tenant-s",
    )
    caplog.set_level(logging.DEBUG)
    key = keys(redis_url, "add", "--tenant", "acme").strip()
    assert moderate(gateway, key).status_code == 200
    assert moderate(gateway, "settings-key-123").status_code == 200  # the settings' keys still count
    missing = httpx.post(f"{gateway.url}/v1/moderations", json=BODY, timeout=30)
    assert (missing.status_code, error_body(missing)["type"]) == (401, "authentication_error")
    assert moderate(gateway, "mg_guessed").status_code == 401

    key_id = keys(redis_url, "list").split()[0]
    assert keys(redis_url, "revoke", key_id).startswith(f"revoked {key_id}")
    revoked = moderate(gateway, key)
    assert revoked.status_code == 401
    assert error_body(revoked)["code"] == "invalid_api_key"
    assert key not in caplog.text
    assert "settings-key-123" not in caplog.text


def test_revoking_an_unknown_key_fails(redis_url: str) -> None:
    result = CliRunner().invoke(cli, ["keys", "revoke", "deadbeef00"], env={"MODGATE_REDIS__URL": redis_url})
    assert result.exit_code == 1


def test_a_business_key_on_an_admin_call_gets_403(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys="business-key-1:tenant-a")
    policy = f"{gateway.url}/admin/thinking-policy"
    answer = httpx.get(policy, headers={"Authorization": "Bearer business-key-1"})
    assert (answer.status_code, error_body(answer)["type"]) == (403, "permission_error")
    admin = httpx.get(policy, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert admin.status_code == 200


def test_with_redis_down_a_redis_key_gets_503_and_a_settings_key_still_works(
    start_gateway: GatewayFactory, sim: ThreadedServer, own_redis: RedisServer
) -> None:
    key = keys(own_redis.url, "add", "--tenant", "acme").strip()
    gateway = start_gateway(
        engine_url=sim.url,
        redis_url=own_redis.url,
        api_keys_from_redis=True,
        api_keys="settings-key-123:tenant-s",
    )
    own_redis.stop()
    unverifiable = moderate(gateway, key)
    assert (unverifiable.status_code, error_body(unverifiable)["code"]) == (503, "state_unavailable")
    assert moderate(gateway, "settings-key-123").status_code == 200
