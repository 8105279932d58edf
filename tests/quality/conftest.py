"""Fixtures for the quality tests (the shared `redis_url` fixture comes from tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.quality.fakes import FakeGateway


@pytest.fixture
def fake_gateway() -> FakeGateway:
    return FakeGateway()
