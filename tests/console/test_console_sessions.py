"""Signed console sessions and their CSRF tokens, with a clock the tests move."""

from __future__ import annotations

import pytest

from gateway.http.console.sessions import SessionSigner
from tests.support import FakeClock

TOKEN = "console-admin-token-0123456789"



def test_an_issued_session_reads_back_with_its_operator_and_actor() -> None:
    signer = SessionSigner(TOKEN, ttl_s=3600)
    session, cookie = signer.issue("alice", "admin:1a2b3c4d")
    assert signer.read(cookie) == session
    assert session.actor == "alice (admin:1a2b3c4d, console)"
    assert TOKEN not in cookie


def test_a_session_expires_after_its_lifetime() -> None:
    clock = FakeClock(1_800_000_000.0)
    signer = SessionSigner(TOKEN, ttl_s=3600, clock=clock)
    _, cookie = signer.issue("alice", "admin:1a2b3c4d")
    clock.now += 3599
    assert signer.read(cookie) is not None
    clock.now += 1
    assert signer.read(cookie) is None


def test_a_session_signed_under_another_admin_token_is_refused() -> None:
    _, cookie = SessionSigner("an-older-admin-token-0123", ttl_s=3600).issue("alice", "admin:1a2b3c4d")
    assert SessionSigner(TOKEN, ttl_s=3600).read(cookie) is None


@pytest.mark.parametrize("cookie", ["", "v1", "v1..", "v2.e30.abc", "v1.e30.abc", "v1.e30.é", "v1.@@@.@@@"])
def test_malformed_cookies_read_as_no_session(cookie: str) -> None:
    assert SessionSigner(TOKEN, ttl_s=3600).read(cookie) is None


def test_a_signed_but_unreadable_payload_reads_as_no_session() -> None:
    signer = SessionSigner(TOKEN, ttl_s=3600)
    payload = "bm90IGpzb24"  # "not json"
    assert signer.read(f"v1.{payload}.{signer._sign(payload)}") is None


def test_each_session_has_its_own_csrf_token() -> None:
    signer = SessionSigner(TOKEN, ttl_s=3600)
    alice, _ = signer.issue("alice", "admin:1a2b3c4d")
    bob, _ = signer.issue("bob", "admin:1a2b3c4d")
    assert signer.csrf_valid(alice, signer.csrf_token(alice))
    assert not signer.csrf_valid(alice, signer.csrf_token(bob))
    assert not signer.csrf_valid(alice, "")
    assert not signer.csrf_valid(alice, "ünïcode-is-not-a-token")


def test_an_operator_name_outside_the_audit_alphabet_is_refused() -> None:
    with pytest.raises(ValueError, match="operator"):
        SessionSigner(TOKEN, ttl_s=3600).issue("alice; rm", "admin:1a2b3c4d")
