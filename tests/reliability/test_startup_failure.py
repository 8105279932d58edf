"""A gateway that cannot finish starting closes what it had opened, and says why."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.http.auth import KeyRing
from gateway.http.services import open_services
from gateway.settings import Settings


class ClosingTransport(httpx.MockTransport):
    """A fake engine that remembers being closed (its client closes it when the engine pool closes)."""

    def __init__(self) -> None:
        super().__init__(lambda request: httpx.Response(503, json={"error": {"message": "fake engine"}}))
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


def unusable_records_dir(tmp_path: Path) -> Path:
    """A records directory that cannot be created: its parent is a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return blocker / "records"


async def test_a_failure_half_way_through_start_up_closes_the_engines_opened_before(tmp_path: Path) -> None:
    # The quality records are opened after the engine pool, the policy store and the engine scraper.
    settings = Settings(quality={"records_dir": unusable_records_dir(tmp_path)})
    transport = ClosingTransport()
    with pytest.raises(NotADirectoryError):
        async with open_services(settings, KeyRing({}, None), transport):
            pytest.fail("the services started with a records directory that cannot exist")
    assert transport.closed


async def test_services_that_started_close_the_engines_on_the_way_out(tmp_path: Path) -> None:
    settings = Settings(quality={"records_dir": tmp_path / "records"})
    transport = ClosingTransport()
    async with open_services(settings, KeyRing({}, None), transport) as services:
        assert services.engines.engines
        assert not transport.closed
    assert transport.closed
