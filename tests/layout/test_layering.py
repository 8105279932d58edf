"""The service does not know how it is deployed: only the command line (cli/) composes the simulator and the
gateway. Which package may import which is tests/layout/test_floors.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest

from cli.main import engine_settings
from gateway.http.auth import KeyRing
from gateway.http.services import MissingEngine, open_services
from gateway.settings import Settings

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
CLI = GATEWAY.parent / "cli"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, as written (``from x import y`` gives ``x`` and ``x.y``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_command_line_is_where_the_simulator_is_started() -> None:
    assert any(name.startswith("deploy.simulator") for name in imported_modules(CLI / "main.py"))


async def test_services_without_an_engine_url_fail_with_a_readable_message() -> None:
    with pytest.raises(MissingEngine, match="MODGATE_ENGINE__URL"):
        async with open_services(Settings(engine_url=None), KeyRing({}, None)):
            pass


def test_the_command_line_starts_the_simulator_when_no_engine_is_set_and_stops_it_after() -> None:
    settings = Settings(engine_url=None, simulator={"preset": "instant", "time_scale": 0})
    with engine_settings(settings) as served:
        assert served.engine_url is not None
        models = httpx.get(f"{served.engine_url}/v1/models", timeout=10).json()
        assert models["data"][0]["id"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{served.engine_url}/v1/models", timeout=2)


def test_a_configured_engine_is_passed_through_unchanged() -> None:
    settings = Settings(engine_url="http://engine.example:8000")
    with engine_settings(settings) as served:
        assert served is settings


BELOW_THE_EDGE = ("moderation", "jobs", "engine", "policy")


@pytest.mark.parametrize(
    "path",
    [path for stage in BELOW_THE_EDGE for path in sorted((GATEWAY / stage).rglob("*.py"))],
    ids=lambda path: str(path.relative_to(GATEWAY)),
)
def test_no_stage_below_the_http_edge_imports_it(path: Path) -> None:
    """Dependencies point down the flow: the caller's identity comes in as a gateway.caller.Caller value."""
    reached = {name for name in imported_modules(path) if name.split(".")[:2] == ["gateway", "http"]}
    assert not reached, f"{path.relative_to(GATEWAY.parent)} imports {sorted(reached)}"
