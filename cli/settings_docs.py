"""docs/settings.md, written from the settings model: ``python -m cli.settings_docs``.

Each variable's name comes from the model (``MODGATE_<GROUP>__<NAME>``), its default from
the field, and its meaning from the comments beside the field in its group's own source file
(gateway/settings/, gateway/console_settings.py), so a setting added there is documented by running this
again (tests/layout/test_settings_docs.py fails until it is).
"""

from __future__ import annotations

import ast
import inspect
import io
import sys
import tokenize
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.renamed_settings import NESTED, PREFIX, RENAMED_COMMAND_ENVVARS, deprecated_env_names
from gateway.settings import Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def field_comments(source: str) -> dict[tuple[str, str], str]:
    """``(class, field) -> comment`` from the comment lines above a field and the comments on its lines."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above: list[str] = []
            line = item.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments.get(line, ""))
                line -= 1
            span = range(item.lineno, (item.end_lineno or item.lineno) + 1)
            beside = [comments[n] for n in span if n in comments]
            text = " ".join(part for part in [*above, *beside] if part and not part.startswith("noqa"))
            found[(node.name, item.target.id)] = text
    return found


def _default(field: FieldInfo) -> str:
    if field.default_factory is None and field.default is PydanticUndefined:
        return "required"
    value: Any = field.get_default(call_default_factory=True, validated_data={})
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value}`" if value != "" else '`""`'


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(model: type[BaseModel], prefix: str, comments: dict[tuple[str, str], str]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            continue
        what = comments.get((model.__name__, name), "")
        rows.append(f"| `{prefix}{name.upper()}` | {_cell(_default(field))} | {_cell(what)} |")
    return rows


def _group_comments(groups: list[type[BaseModel]]) -> dict[tuple[str, str], str]:
    """Every group's field comments, each read from the file the group is defined in."""
    comments: dict[tuple[str, str], str] = {}
    for source in dict.fromkeys(inspect.getsourcefile(group) for group in groups):
        if source is not None:
            comments |= field_comments(Path(source).read_text())
    return comments


def settings_markdown() -> str:
    """The whole page."""
    groups = [field.annotation for field in Settings.model_fields.values()]
    comments = _group_comments([g for g in groups if isinstance(g, type) and issubclass(g, BaseModel)])
    out = [
        "# Settings",
        "",
        "Use this page to configure the gateway: every environment variable it reads, its default and what",
        "it changes. Written from the settings model (gateway/settings/) by `python -m cli.settings_docs`;",
        "do not edit.",
        "",
        f"Every setting is `{PREFIX}<GROUP>{NESTED}<NAME>`, its group and its name joined by `{NESTED}`",
        "(`MODGATE_ENGINE__URL`, `MODGATE_SERVER__PORT`). A group can also be set whole, as JSON",
        "(`MODGATE_ENGINE='{\"url\": \"http://vllm:8000\", \"max_inflight\": 16}'`).",
    ]
    for name, field in Settings.model_fields.items():
        group = field.annotation
        if not (isinstance(group, type) and issubclass(group, BaseModel)):
            continue
        doc = (group.__doc__ or "").strip().splitlines()[0] if group.__doc__ else ""
        out += [
            "",
            f"## `{PREFIX}{name.upper()}{NESTED}*`",
            "",
            *([doc, ""] if doc else []),
            "| variable | default | what it changes |",
            "| --- | --- | --- |",
            *_rows(group, f"{PREFIX}{name.upper()}{NESTED}", comments),
        ]
    out += [
        "",
        "## Deprecated names",
        "",
        "These older names are still read, each with a deprecation warning in the log at start; where both",
        "are set, the new name wins. The Python attributes and keywords of the same old names",
        "(`settings.engine_url`, `Settings(engine_url=...)`) keep working too. An `.env` file that feeds a",
        "compose file's `${...}` needs the names that file asks for: deploy/spark asks for the new ones.",
        "",
        "| deprecated | use instead |",
        "| --- | --- |",
        *(f"| `{old}` | `{new}` |" for old, new in deprecated_env_names().items()),
        "",
        "## The command line",
        "",
        "Every command that talks to a running gateway (`modgate policy`, `modgate stats`, `modgate",
        "quality run`) finds it with `--gateway-url`, else `MODGATE_GATEWAY_URL`, else",
        "`http://127.0.0.1:8080`. The older names still work, each with a deprecation warning:",
        "",
        "| deprecated | use instead |",
        "| --- | --- |",
        *(f"| `{old}` | `{new}` |" for old, new in RENAMED_COMMAND_ENVVARS.items()),
        "| `--url` (`modgate policy`, `modgate stats`) | `--gateway-url` |",
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    """Write docs/settings.md (``--check``: exit 1 when it is not current)."""
    page = settings_markdown()
    if "--check" in sys.argv[1:]:
        sys.exit(0 if PAGE.exists() and PAGE.read_text() == page else 1)
    PAGE.write_text(page)
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
