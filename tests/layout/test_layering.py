"""The service does not know how it is deployed: only the command line composes the simulator and the gateway.

Read from the source (every import statement, top-level or inside a function), so a lazy import is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest

from gateway.cli.main import engine_settings
from gateway.http.auth import KeyRing
from gateway.http.services import MissingEngine, open_services
from gateway.settings import Settings

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
CLI = GATEWAY / "cli"
CLI_PACKAGE = ".".join(CLI.relative_to(GATEWAY.parent).parts)  # the command line's package name


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


def service_modules() -> list[Path]:
    """The gateway's modules outside its command line."""
    return sorted(path for path in GATEWAY.rglob("*.py") if CLI not in path.parents)


def test_the_layout_has_service_modules_and_a_command_line() -> None:
    assert len(service_modules()) > 20
    assert (CLI / "main.py").is_file()


@pytest.mark.parametrize("path", service_modules(), ids=lambda path: str(path.relative_to(GATEWAY)))
def test_no_service_module_imports_deploy_or_the_command_line(path: Path) -> None:
    reached = {
        name for name in imported_modules(path)
        if name in ("deploy", CLI_PACKAGE) or name.startswith(("deploy.", f"{CLI_PACKAGE}."))
    }
    assert not reached, f"{path.relative_to(GATEWAY.parent)} imports {sorted(reached)}: only gateway/cli/ may"


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
