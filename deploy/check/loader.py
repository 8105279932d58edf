"""Inputs of `deploy check`: compose files as YAML node trees (which keep line numbers), and `.env` files."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from deploy.check.interpolation import VAR_NAME, Interpolator
from deploy.check.model import Finding, Location, UnreadableInputError

COMPOSE_FILE_NAMES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")

INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
BOOL_TAG = "tag:yaml.org,2002:bool"
NULL_TAG = "tag:yaml.org,2002:null"
MERGE_TAG = "tag:yaml.org,2002:merge"

_QUOTED_ENV_VALUE = re.compile(r"""(?P<quote>["'])(?P<value>.*?)(?<!\\)(?P=quote)(\s+#.*)?""", re.DOTALL)


@dataclass(frozen=True)
class Document:
    """One compose file: its text (to place the words of a command string) and its YAML node tree."""

    path: Path
    text: str
    root: MappingNode

    def line_of(self, node: Node) -> int:
        return int(node.start_mark.line) + 1

    def at(self, node: Node) -> Location:
        return Location(self.path, self.line_of(node))


@dataclass(frozen=True)
class DotEnv:
    """A parsed `.env`: each variable's value and the line that set it."""

    path: Path
    values: dict[str, str]
    lines: dict[str, int]


def find_compose_files(paths: Sequence[Path]) -> list[Path]:
    """Compose files named by `paths`: files as given, directories by compose's own file names."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = next((path / name for name in COMPOSE_FILE_NAMES if (path / name).is_file()), None)
            if found is None:
                raise UnreadableInputError(f"{path}: no {' / '.join(COMPOSE_FILE_NAMES)} in this folder")
            files.append(found)
        elif path.is_file():
            files.append(path)
        else:
            raise UnreadableInputError(f"{path}: no such file or folder")
    return files


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableInputError(f"{path}: cannot read: {exc}") from exc


def load_document(path: Path) -> Document:
    """A compose file's node tree; UnreadableInputError unless it is YAML with a `services:` mapping."""
    text = _read_text(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else "?"
        raise UnreadableInputError(f"{path}:{line}: not valid YAML: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise UnreadableInputError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(root, MappingNode):
        raise UnreadableInputError(f"{path}: the top level is not a mapping")
    services = get(root, "services")
    if not isinstance(services, MappingNode):
        raise UnreadableInputError(f"{path}: no `services:` mapping")
    return Document(path, text, root)


def _unquote_env_value(raw: str) -> tuple[str, bool]:
    """The value of a `.env` line and whether it may hold `${VAR}` (single quotes are literal)."""
    raw = raw.strip()
    quoted = _QUOTED_ENV_VALUE.fullmatch(raw)
    if quoted is not None and quoted.group("quote") == "'":
        return quoted.group("value"), False
    if quoted is not None:
        return quoted.group("value").replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"), True
    comment = re.search(r"\s#", raw)
    return (raw[: comment.start()] if comment else raw).strip(), True


def read_dotenv(path: Path, environ: Mapping[str, str], findings: list[Finding]) -> DotEnv:
    """Parse a `.env` as compose does: KEY=VALUE lines, `#` comments, quotes, `${VAR}` from earlier lines."""
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        stripped = stripped.removeprefix("export ").lstrip()
        key, equals, raw = stripped.partition("=")
        key = key.strip()
        if not equals or not VAR_NAME.fullmatch(key):
            findings.append(
                Finding(
                    "error", "env-file", f"not a KEY=VALUE line: {line.strip()!r}", Location(path, number)
                )
            )
            continue
        value, interpolated = _unquote_env_value(raw)
        if interpolated:
            value = Interpolator({**values, **environ}).expand(value)
        values[key] = value
        lines[key] = number
    return DotEnv(path, values, lines)


# --- YAML node access --------------------------------------------------------------------------------


def pairs(node: MappingNode) -> list[tuple[Node, Node]]:
    """Key/value pairs with YAML merge keys (`<<: *anchor`) applied; explicit keys win over merged ones."""
    merged: list[tuple[Node, Node]] = []
    explicit: list[tuple[Node, Node]] = []
    for key, value in node.value:
        if key.tag == MERGE_TAG:
            sources = value.value if isinstance(value, SequenceNode) else [value]
            for source in sources:
                if isinstance(source, MappingNode):
                    merged.extend(pairs(source))
        else:
            explicit.append((key, value))
    names = {key.value for key, _ in explicit}
    return [pair for pair in merged if pair[0].value not in names] + explicit


def get(node: Node | None, key: str) -> Node | None:
    """The value under `key` of a mapping node (merge keys applied); None for a missing key or non-mapping."""
    if not isinstance(node, MappingNode):
        return None
    found: Node | None = None
    for key_node, value in pairs(node):
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            found = value  # the later of two equal keys, as PyYAML would keep; duplicate-key reports it
    return found


def scalars(node: Node) -> Iterator[ScalarNode]:
    """Every value scalar below `node` (mapping keys excluded: compose interpolates values only)."""
    if isinstance(node, ScalarNode):
        yield node
    elif isinstance(node, SequenceNode):
        for item in node.value:
            yield from scalars(item)
    elif isinstance(node, MappingNode):
        for _key, value in node.value:
            yield from scalars(value)


def mappings(node: Node) -> Iterator[MappingNode]:
    """Every mapping node below `node`, each once (an alias is the same node object)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, MappingNode):
            yield current
            stack.extend(value for _key, value in current.value)
        elif isinstance(current, SequenceNode):
            stack.extend(current.value)
