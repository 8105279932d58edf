"""Old flat setting names (``settings.engine_url``, ``Settings(engine_url=...)``) are read only in the
renaming layer (gateway/renamed_settings.py) and its own tests: everywhere else the grouped names
(``settings.engine.url``) are used, so the old ones can be dropped by deleting one module.

Found from the syntax tree: an attribute read on a settings object (a name ending in ``settings``, or
``served``), a keyword of ``Settings(...)`` or of the test factories that hand their keywords to it, and a
key of a settings object's ``model_copy(update={...})``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from gateway.renamed_settings import RENAMED

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shaping", "contracts", "gateway", "quality", "deploy", "cli", "bench", "tests")
RENAMING_LAYER = {Path("gateway/renamed_settings.py"), Path("tests/gateway/test_settings_names.py")}
SETTINGS_FACTORIES = {"Settings", "start_gateway", "gateway_for", "oidc_gateway", "limited"}
"""Callables whose keywords are Settings' own (the test factories pass theirs on to ``Settings``)."""


def last_name(node: ast.expr) -> str | None:
    """``services.settings`` as ``settings``; ``Settings`` as itself."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def holds_settings(node: ast.expr) -> bool:
    name = last_name(node)
    return name is not None and (name.lower().endswith("settings") or name == "served")


def old_names_read(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each old name read in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in RENAMED and holds_settings(node.value):
            yield node.lineno, f".{node.attr}"
        if not isinstance(node, ast.Call):
            continue
        if last_name(node.func) in SETTINGS_FACTORIES:
            for keyword in node.keywords:
                if keyword.arg in RENAMED:
                    yield node.lineno, f"{keyword.arg}="
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "model_copy" and holds_settings(func.value):
            for keyword in node.keywords:
                if keyword.arg == "update" and isinstance(keyword.value, ast.Dict):
                    for key in keyword.value.keys:
                        if isinstance(key, ast.Constant) and key.value in RENAMED:
                            yield node.lineno, f'update={{"{key.value}": ...}}'


def test_no_module_outside_the_renaming_layer_reads_an_old_setting_name() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in RENAMING_LAYER
        for line, what in old_names_read(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert found == []


def test_the_check_sees_each_way_an_old_name_is_read() -> None:
    source = """
settings.engine_url
services.settings.max_inflight
Settings(redis_url="redis://r")
start_gateway(admin_token="t")
settings.model_copy(update={"host": "0.0.0.0"})
settings.engine.url
settings.shadow.engine_url
report.engine_url
"""
    assert [what for _, what in old_names_read(ast.parse(source))] == [
        ".engine_url", ".max_inflight", "redis_url=", "admin_token=", 'update={"host": ...}',
    ]
