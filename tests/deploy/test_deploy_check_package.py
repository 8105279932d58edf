"""`deploy.check` as a package: its public surface, `read_services` for other commands, and the layout rules
of issue 18 (no module in deploy/ over 600 lines, no import cycle)."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import pytest

import deploy.check
from deploy.check import EngineFlag, Location, UnreadableInputError, read_services

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MAX_MODULE_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _deploy_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(DEPLOY.rglob("*.py"))}


def test_no_module_in_deploy_is_longer_than_600_lines() -> None:
    lengths = {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in _deploy_modules().items()
    }
    too_long = {name: lines for name, lines in lengths.items() if lines > MAX_MODULE_LINES}
    assert lengths, "no module found under deploy/"
    assert too_long == {}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The deploy modules that `name` imports by an import statement (a submodule where one is named)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {module for module in found if module in modules and module != name}


def test_the_modules_of_deploy_import_each_other_without_a_cycle() -> None:
    modules = _deploy_modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["deploy.check.rules"] >= {"deploy.check.rules.engine", "deploy.check.compose"}
    cycles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_every_deploy_check_module_imports_first_in_a_fresh_interpreter() -> None:
    """A cycle that only bites in one import order shows up as an ImportError when that module comes first."""
    names = sorted(name for name in _deploy_modules() if name.startswith("deploy.check"))
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'deploy' or m.startswith('deploy.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "    print(name)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == names


def test_the_public_names_of_deploy_check_are_exactly_its_all() -> None:
    public = {
        name
        for name, value in vars(deploy.check).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    }
    assert public == set(deploy.check.__all__)
    assert {"check_deploy", "find_compose_files", "run_compose_config", "read_services"} <= public


def test_read_services_gives_each_flag_as_the_engine_reads_it(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text(
        "services:\n"
        "  vllm:\n"
        "    image: vllm/vllm-openai:v0.32.0\n"
        "    command:\n"
        '      - "--max_num_seqs"\n'
        '      - "${SEQS}"\n'
        '      - "--no-enable-chunked-prefill"\n'
        '      - "--max-num-seqs=4"\n'
        "  gateway:\n"
        "    image: modgate-gateway:local\n"
        "    environment:\n"
        '      MODGATE_ENGINE__MAX_INFLIGHT: "${INFLIGHT:-8}"\n',
        encoding="utf-8",
    )
    (tmp_path / ".env").write_text("SEQS=16\n", encoding="utf-8")

    engine, gateway = read_services([compose], environ={"INFLIGHT": "3"})

    assert (engine.name, engine.is_engine, engine.is_gateway) == ("vllm", True, False)
    assert engine.flags == (
        EngineFlag("--max_num_seqs", "--max-num-seqs", "16", False, Location(compose, 5)),
        EngineFlag(
            "--no-enable-chunked-prefill", "--enable-chunked-prefill", None, True, Location(compose, 7)
        ),
        EngineFlag("--max-num-seqs", "--max-num-seqs", "4", False, Location(compose, 8)),
    )
    assert engine.last("--max-num-seqs") == engine.flags[2]
    assert engine.last("--speculative-config") is None
    assert (gateway.is_gateway, gateway.environment) == (True, {"MODGATE_ENGINE__MAX_INFLIGHT": "3"})


def test_read_services_refuses_a_missing_env_file(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  redis:\n    image: redis:7\n", encoding="utf-8")
    missing = tmp_path / "nope.env"
    with pytest.raises(UnreadableInputError, match=r"nope\.env: no such file"):
        read_services([compose], env_file=missing)
