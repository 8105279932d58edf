"""The data URL's base64 is read by pybase64 first and by strict binascii where pybase64 refuses: together
they read every payload as strict binascii alone did (the bytes, or the refusal and its message)."""

from __future__ import annotations

import binascii

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shaping.errors import InvalidDataUrl, short_reason
from shaping.image.data_url import _strict_base64

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


def binascii_alone(payload: str) -> bytes | str:
    """What the decoder was: strict binascii's bytes, or its refusal's message."""
    try:
        return binascii.a2b_base64(payload.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        return f"the data URL's base64 is not valid ({short_reason(exc)})"


def decoded(payload: str) -> bytes | str:
    try:
        return _strict_base64(payload)
    except InvalidDataUrl as exc:
        return str(exc)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=ALPHABET + " \n-_é", max_size=24))
def test_any_payload_is_read_as_strict_binascii_read_it(payload: str) -> None:
    assert decoded(payload) == binascii_alone(payload)


@pytest.mark.parametrize("payload", ["xba8=", "YWJj=", "YQ==YQ==", "YW Jj", "YWJ", "=YWJj", "YWJjé"])
def test_what_pybase64_refuses_binascii_decides(payload: str) -> None:
    # "xba8=" (a lone "=" after whole quartets): pybase64 refuses, strict binascii accepted and still does
    assert decoded(payload) == binascii_alone(payload)
