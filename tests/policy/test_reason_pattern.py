"""A policy change's ``reason``: the pattern the OpenAPI document publishes and the server's own check agree
on every string (schemathesis found a schema-valid reason of control characters refused 400)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import ModgateError
from gateway.http.routes.admin import REASON_PATTERN, RollbackRequest, _reason

# the characters where regex dialects and str.strip() disagree, and plain text around them
TRICKY = st.sampled_from(
    ["\x1c", "\x1f", "\x85", "\u00a0", "\u2028", "\ufeff", "\u200b", " ", "\t", "a", "b"]
)


def accepted_by_server(reason: str) -> bool:
    try:
        _reason(reason)
    except ModgateError:
        return False
    return True


@given(st.lists(TRICKY, max_size=8).map("".join))
def test_the_published_pattern_and_the_server_agree(reason: str) -> None:
    assert bool(re.fullmatch(REASON_PATTERN, reason)) == accepted_by_server(reason), repr(reason)


@pytest.mark.parametrize("reason", ["\x1c\x1d\x1e", "\x85ab", "a\u2028b"])
def test_a_reason_the_schema_admits_is_accepted_by_every_check(reason: str) -> None:
    assert re.fullmatch(REASON_PATTERN, reason)
    assert accepted_by_server(reason)
    assert RollbackRequest(reason=reason).reason == reason


@pytest.mark.parametrize("reason", ["ab", "  a ", "\u00a0ab\u00a0", " \t\n"])
def test_a_reason_of_white_space_and_fewer_than_three_characters_is_refused(reason: str) -> None:
    assert not re.fullmatch(REASON_PATTERN, reason)
    assert not accepted_by_server(reason)
