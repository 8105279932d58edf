"""`modgate deploy check`: static checks of the Spark compose files and their `.env`, with file and line.

The rules encode the Spark's deploy pitfalls and tuned engine (docs/spark.md). Severity follows one principle:
an *error* means the deploy will not start, or will silently run something other than what is written or
what the gateway relies on; a *warning* means it runs, but departs from the measured tuning or carries
a value the engine will not use as written.

Rules (rule id, severity: what it checks):

- duplicate-key, error: a key given twice in one YAML mapping (compose refuses the file; PyYAML would
  silently keep the later one).
- duplicate-flag, error: a CLI flag given twice in one service's entrypoint + command; the later one
  silently wins. `--x` and `--no-x`, `--a_b` and `--a-b` count as one flag. Both lines are reported.
- unquoted-number, error: an item of a command, entrypoint or healthcheck-test list that YAML reads as a
  number (or a boolean or null): compose's schema wants strings there.
- command-syntax, error: a command string that cannot be split like a shell line (unbalanced quotes).
- interpolation, error: `${VAR:?msg}` / `${VAR?msg}` unset, or a malformed `${...}`: compose refuses to
  start. Warning: a plain `${VAR}` that is unset (compose substitutes an empty string).
- env-file, error: a `.env` line that is not `KEY=VALUE`. Warning: no `.env` beside the compose file, so
  variables were resolved from `.env.example`.
- memory-fraction-mismatch, error: the engine's `--gpu-memory-utilization` differs from
  `PYTORCH_ALLOC_CONF`'s `per_process_memory_fraction` after resolving variables (the engine OOMs at
  start). Warning: one of the two is set without the other.
- speculative-decoding, error: `--speculative-config`, `--speculative-model`, `--num-speculative-tokens`
  or any `--speculative-*` (MTP included): slower on this workload (MTP accepted 1.6 of 4 drafted
  tokens), and vLLM's Mamba cache 'align' mode (hybrid models with prefix caching) refuses it at start.
- prefill-scheduling, warning: `--long-prefill-token-threshold`, `--max-num-partial-prefills`,
  `--max-long-partial-prefills`, `--no-enable-chunked-prefill`: the tuned engine uses none.
- prefill-balancing, warning: any of the six prefill-balancing flags of the Spark's vLLM fork,
  `--prefill-compute-share`, `--prefill-compute-half-life`, `--max-num-prefill-tokens-per-step`,
  `--max-parallel-prefills`, `--prefill-policy`, `--decode-refill-target`. Measured on the Spark, they cut
  its rate from 46.7 requests/min without them to 24.3, 34.7 and 30.7 in three rounds, all below the 45
  keyframes a minute the business needs; the tuned engine sets none. (A warning by the rule above: the
  engine runs them as written.)
- scheduling-policy, error: a gateway service in the same files sets `MODGATE_ENGINE__USE_PRIORITY` true
  (it then sends each request's priority) and its engine has no `--scheduling-policy priority` (vLLM's
  default fcfs rejects every request whose priority is not 0); or a value vLLM does not accept (it takes
  only fcfs and priority), or a use_priority value the gateway cannot read as a boolean. Without
  use_priority the gateway sends no priority, and fcfs (the seed's final configuration) is fine.
- prompt-tokens-details, error: `--enable-prompt-tokens-details` missing: the per-request truth about
  prefix-cache hits, `usage.prompt_tokens_details.cached_tokens`, comes back null and reads as 0.
- mamba-block-size, error: `--mamba-block-size` not a positive multiple of 8 (vLLM aligns Mamba blocks
  to its causal_conv1d kernel). Warnings, where vLLM will not use the value as written: set without
  `--enable-prefix-caching` (one block per sequence); with `--mamba-cache-mode align` (replaced by the
  attention block size); not a multiple of 16, the smallest attention-kernel block alignment (in mode
  'all' vLLM rounds it to a multiple of lcm(value, kernel alignment) large enough for one Mamba state).
- max-inflight, error: the gateway's `MODGATE_MAX_INFLIGHT` (default 8) above its engine's
  `--max-num-seqs`: the excess queues inside the engine, outside the gateway's priority queue and
  deadlines.
- compose-config, error: `docker compose config -q` failed (run only where `docker compose` works; it
  needs no engine. Elsewhere the report says "skipped: docker compose not usable").

An engine service is one whose image or entrypoint/command names vLLM; a gateway service is one with a
`MODGATE_*` environment variable or a command that runs `modgate`. Flags are matched as vLLM's parser
reads them: the last occurrence wins, underscores equal dashes.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from pydantic import TypeAdapter, ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Severity = Literal["error", "warning"]

COMPOSE_FILE_NAMES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")
DEFAULT_MAX_INFLIGHT = 8  # the gateway's default MODGATE_MAX_INFLIGHT (docs/spark.md)

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_NULL_TAG = "tag:yaml.org,2002:null"
_MERGE_TAG = "tag:yaml.org,2002:merge"

# Flags whose repetition accumulates instead of overriding (vLLM's --middleware, Redis' --save ...).
_REPEATABLE_FLAGS = frozenset({"--middleware", "--save", "--loadmodule", "--include", "--rename-command"})
# Boolean switches of vLLM that take no value, so the token after them is not read as theirs.
_VALUELESS_PREFIXES = ("--enable-", "--disable-", "--no-")
_VALUELESS_FLAGS = frozenset({"--trust-remote-code", "--enforce-eager", "--headless", "--allow-credentials"})
_PREFILL_KNOBS = (
    "--long-prefill-token-threshold",
    "--max-num-partial-prefills",
    "--max-long-partial-prefills",
    "--enable-chunked-prefill",  # only its --no- form: turning on the default changes nothing
)
# The Spark's vLLM fork's prefill-balancing flags. Measured on the Spark with them (three rounds): 24.3, 34.7
# and 30.7 requests/min, against 46.7 without any.
_FORK_PREFILL_KNOBS = (
    "--prefill-compute-share",
    "--prefill-compute-half-life",
    "--max-num-prefill-tokens-per-step",
    "--max-parallel-prefills",
    "--prefill-policy",
    "--decode-refill-target",
)
_RATE_WITHOUT_FORK_KNOBS = 46.7  # requests/min, the tuned Spark
_RATES_WITH_FORK_KNOBS = (24.3, 34.7, 30.7)  # requests/min, three measured rounds
_BUSINESS_MINIMUM = 45  # keyframes a minute
_SCHEDULING_POLICIES = ("fcfs", "priority")
# The gateway setting that makes it send priorities (gateway/settings.py EngineSettings.use_priority).
USE_PRIORITY_VARIABLE = "MODGATE_ENGINE__USE_PRIORITY"
_ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
_ATTENTION_KERNEL_ALIGNMENT = 16  # FlashAttention/FlashInfer block sizes are multiples of 16
_CONV_KERNEL_ALIGNMENT = 8  # vLLM: mamba_block_size "must be a multiple of 8 to align with causal_conv1d"
_NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?")
_QUOTED_ENV_VALUE = re.compile(r"""(?P<quote>["'])(?P<value>.*?)(?<!\\)(?P=quote)(\s+#.*)?""", re.DOTALL)
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL)


class UnreadableInputError(Exception):
    """A compose file or `.env` that cannot be read or parsed at all (exit status 2)."""


@dataclass(frozen=True)
class Location:
    """A place in an input file; `line` is 1-based, None when the finding concerns the whole file."""

    file: Path
    line: int | None = None


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on one place; `related` holds the other places it involves."""

    severity: Severity
    rule: str
    message: str
    location: Location
    related: tuple[Location, ...] = ()


@dataclass(frozen=True)
class CheckReport:
    """Everything one `deploy check` run found, plus what became of `docker compose config -q`."""

    compose_files: tuple[Path, ...]
    env_file: Path | None
    findings: tuple[Finding, ...]
    compose_config: str

    @property
    def errors(self) -> int:
        return sum(1 for finding in self.findings if finding.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for finding in self.findings if finding.severity == "warning")


# --- inputs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Document:
    path: Path
    text: str
    root: MappingNode

    def line_of(self, node: Node) -> int:
        return int(node.start_mark.line) + 1

    def at(self, node: Node) -> Location:
        return Location(self.path, self.line_of(node))


@dataclass(frozen=True)
class _DotEnv:
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


def _load_document(path: Path) -> _Document:
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
    services = _get(root, "services")
    if not isinstance(services, MappingNode):
        raise UnreadableInputError(f"{path}: no `services:` mapping")
    return _Document(path, text, root)


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


def _read_dotenv(path: Path, environ: Mapping[str, str], findings: list[Finding]) -> _DotEnv:
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
        if not equals or not _VAR_NAME.fullmatch(key):
            findings.append(
                Finding(
                    "error", "env-file", f"not a KEY=VALUE line: {line.strip()!r}", Location(path, number)
                )
            )
            continue
        value, interpolated = _unquote_env_value(raw)
        if interpolated:
            value = _Interpolator({**values, **environ}).expand(value)
        values[key] = value
        lines[key] = number
    return _DotEnv(path, values, lines)


# --- YAML node access --------------------------------------------------------------------------------


def _pairs(node: MappingNode) -> list[tuple[Node, Node]]:
    """Key/value pairs with YAML merge keys (`<<: *anchor`) applied; explicit keys win over merged ones."""
    merged: list[tuple[Node, Node]] = []
    explicit: list[tuple[Node, Node]] = []
    for key, value in node.value:
        if key.tag == _MERGE_TAG:
            sources = value.value if isinstance(value, SequenceNode) else [value]
            for source in sources:
                if isinstance(source, MappingNode):
                    merged.extend(_pairs(source))
        else:
            explicit.append((key, value))
    names = {key.value for key, _ in explicit}
    return [pair for pair in merged if pair[0].value not in names] + explicit


def _get(node: Node | None, key: str) -> Node | None:
    if not isinstance(node, MappingNode):
        return None
    found: Node | None = None
    for key_node, value in _pairs(node):
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            found = value  # the later of two equal keys, as PyYAML would keep; duplicate-key reports it
    return found


def _scalars(node: Node) -> Iterator[ScalarNode]:
    """Every value scalar below `node` (mapping keys excluded: compose interpolates values only)."""
    if isinstance(node, ScalarNode):
        yield node
    elif isinstance(node, SequenceNode):
        for item in node.value:
            yield from _scalars(item)
    elif isinstance(node, MappingNode):
        for _key, value in node.value:
            yield from _scalars(value)


def _mappings(node: Node) -> Iterator[MappingNode]:
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen:  # an alias is the same node object: visit it once
            continue
        seen.add(id(current))
        if isinstance(current, MappingNode):
            yield current
            stack.extend(value for _key, value in current.value)
        elif isinstance(current, SequenceNode):
            stack.extend(current.value)


# --- interpolation -----------------------------------------------------------------------------------


@dataclass
class _Interpolator:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?err}`, `${VAR?err}`, `${VAR:+alt}`,
    `${VAR+alt}`, `$VAR` and `$$`, with what went wrong kept as problems."""

    variables: Mapping[str, str]
    problems: list[tuple[Severity, str]] = field(default_factory=list)
    used: list[str] = field(default_factory=list)

    def expand(self, text: str) -> str:
        out: list[str] = []
        index = 0
        while index < len(text):
            char = text[index]
            following = text[index + 1 : index + 2]
            if char != "$":
                out.append(char)
                index += 1
            elif following == "$":
                out.append("$")
                index += 2
            elif following == "{":
                end = _closing_brace(text, index + 2)
                if end < 0:
                    self.problems.append(("error", f"unclosed '${{' in {text!r}"))
                    out.append(text[index:])
                    break
                out.append(self._braced(text[index + 2 : end]))
                index = end + 1
            elif (name := _VAR_NAME.match(text, index + 1)) is not None:
                out.append(self._lookup(name.group(), required=None))
                index = name.end()
            else:
                out.append(char)
                index += 1
        return "".join(out)

    def _lookup(self, name: str, required: str | None) -> str:
        self.used.append(name)
        if name in self.variables:
            return self.variables[name]
        if required is None:
            self.problems.append(
                ("warning", f"${{{name}}} is not set in .env or the environment: compose substitutes ''")
            )
        return ""

    def _braced(self, body: str) -> str:
        match = _BRACED.fullmatch(body)
        if match is None:
            self.problems.append(("error", f"'${{{body}}}' is not a valid interpolation"))
            return ""
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        if op is None:
            return self._lookup(name, required=None)
        self.used.append(name)
        value = self.variables.get(name)
        present = value is not None and (value != "" or not op.startswith(":"))
        if op.endswith("-"):
            return value if present and value is not None else self.expand(arg)
        if op.endswith("+"):
            return self.expand(arg) if present else ""
        if not present or value is None:  # ":?" / "?": compose stops here
            reason = self.expand(arg) or "required"
            self.problems.append(
                ("error", f"${{{name}}} is unset{' or empty' if op == ':?' else ''}: {reason}")
            )
            return ""
        return value


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    index = start
    while index < len(text):
        if text.startswith("${", index):
            depth += 1
            index += 2
            continue
        if text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return -1


# --- services, arguments, flags ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Arg:
    value: str  # after interpolation
    location: Location
    variables: tuple[str, ...]  # the ${VAR}s it was built from


@dataclass(frozen=True)
class _Flag:
    name: str  # as written, e.g. --max_num_seqs
    key: str  # as vLLM's parser matches it, e.g. --max-num-seqs (--no-x and --x share --x)
    value: str | None
    arg: _Arg
    value_arg: _Arg | None

    @property
    def negated(self) -> bool:
        """`--no-x`: the switch turned off."""
        return self.name.replace("_", "-").startswith("--no-")


@dataclass(frozen=True)
class _EnvEntry:
    value: str | None  # None: passed through from the host environment but unset there
    location: Location
    variables: tuple[str, ...]


@dataclass
class _Service:
    name: str
    location: Location
    image: str = ""
    entrypoint: list[_Arg] = field(default_factory=list)
    command: list[_Arg] = field(default_factory=list)
    command_location: Location | None = None
    environment: dict[str, _EnvEntry] = field(default_factory=dict)

    @property
    def args(self) -> list[_Arg]:
        return self.entrypoint + self.command

    @cached_property
    def flags(self) -> list[_Flag]:
        """Parsed once all compose files are merged (the rules run after reading)."""
        return _parse_flags(self.args)

    def last_flag(self, key: str) -> _Flag | None:
        return next((flag for flag in reversed(self.flags) if flag.key == key), None)

    @property
    def is_engine(self) -> bool:
        words = " ".join(arg.value for arg in self.args[:3])
        return "vllm" in self.image.lower() or "vllm" in words.lower()

    @property
    def is_gateway(self) -> bool:
        return any(name.startswith("MODGATE_") for name in self.environment) or any(
            "modgate" in arg.value for arg in self.args[:2]
        )


class _Checker:
    """Reads the compose files once and runs every rule over them."""

    def __init__(
        self, documents: list[_Document], dotenv: _DotEnv | None, environ: Mapping[str, str]
    ) -> None:
        self.documents = documents
        self.dotenv = dotenv
        # Compose's precedence: the shell environment overrides .env.
        self.variables: dict[str, str] = {**(dotenv.values if dotenv else {}), **environ}
        self.from_dotenv = {name for name in (dotenv.values if dotenv else {}) if name not in environ}
        self.findings: list[Finding] = []
        self.services: dict[str, _Service] = {}

    def add(self, severity: Severity, rule: str, message: str, at: Location, *related: Location) -> None:
        self.findings.append(Finding(severity, rule, message, at, tuple(related)))

    def interpolate(self, text: str) -> tuple[str, tuple[str, ...]]:
        """A value and the variables it used; its problems are reported once, by _check_interpolation."""
        interpolator = _Interpolator(self.variables)
        return interpolator.expand(text), tuple(interpolator.used)

    def env_lines(self, variables: Sequence[str]) -> list[Location]:
        """Where in .env the given variables were set (to point at the line to edit)."""
        if self.dotenv is None:
            return []
        return [
            Location(self.dotenv.path, self.dotenv.lines[name])
            for name in variables
            if name in self.from_dotenv
        ]

    # -- reading ----------------------------------------------------------------------------------

    def read(self) -> None:
        for document in self.documents:
            self._check_duplicate_keys(document)
            self._check_interpolation(document)
            services = _get(document.root, "services")
            assert isinstance(services, MappingNode)  # _load_document made sure
            for key, body in _pairs(services):
                if isinstance(body, MappingNode):
                    self._merge_service(document, str(key.value), document.at(key), body)

    def _merge_service(self, document: _Document, name: str, at: Location, body: MappingNode) -> None:
        """Later compose files override earlier ones key by key, as `docker compose -f a -f b` does."""
        service = self.services.setdefault(name, _Service(name, at))
        image = _get(body, "image")
        if isinstance(image, ScalarNode):
            service.image = self.interpolate(image.value)[0]
        entrypoint = _get(body, "entrypoint")
        if entrypoint is not None:
            service.entrypoint = self._args(document, entrypoint)
        command = _get(body, "command")
        if command is not None:
            service.command = self._args(document, command)
            service.command_location = document.at(command)
        for owner in ("entrypoint", "command"):
            self._check_unquoted_numbers(document, _get(body, owner), owner)
        self._check_unquoted_numbers(document, _get(_get(body, "healthcheck"), "test"), "healthcheck test")
        environment = _get(body, "environment")
        if environment is not None:
            service.environment.update(self._environment(document, environment))

    def _args(self, document: _Document, node: Node) -> list[_Arg]:
        if isinstance(node, SequenceNode):
            args = []
            for item in node.value:
                if isinstance(item, ScalarNode) and item.tag != _NULL_TAG:
                    value, variables = self.interpolate(item.value)
                    args.append(_Arg(value, document.at(item), variables))
            return args
        if isinstance(node, ScalarNode) and node.tag != _NULL_TAG:
            return self._split_command_string(document, node)
        return []

    def _split_command_string(self, document: _Document, node: ScalarNode) -> list[_Arg]:
        """Split a command string as compose does, and find each word's line in the source text.

        Words are split before interpolation so that each can be traced to its line; compose splits
        after, which differs only when a variable's value holds spaces or quotes.
        """
        try:
            words = shlex.split(node.value)
        except ValueError as exc:
            self.add(
                "error",
                "command-syntax",
                f"cannot split this command like a shell line: {exc}",
                document.at(node),
            )
            return []
        source = document.text
        cursor = int(node.start_mark.index)
        end = int(node.end_mark.index)
        line = document.line_of(node)
        args = []
        for word in words:
            found = source.find(word, cursor, end) if word else -1
            if found >= 0:
                line = source.count("\n", 0, found) + 1
                cursor = found + len(word)
            value, variables = self.interpolate(word)
            args.append(_Arg(value, Location(document.path, line), variables))
        return args

    def _environment(self, document: _Document, node: Node) -> dict[str, _EnvEntry]:
        entries: dict[str, _EnvEntry] = {}
        if isinstance(node, MappingNode):
            for key, value in _pairs(node):
                if not isinstance(key, ScalarNode):
                    continue
                if isinstance(value, ScalarNode) and value.tag != _NULL_TAG:
                    resolved, variables = self.interpolate(value.value)
                    entries[key.value] = _EnvEntry(resolved, document.at(key), variables)
                else:  # `KEY:` alone passes the host's value through
                    entries[key.value] = _EnvEntry(
                        self.variables.get(key.value), document.at(key), (key.value,)
                    )
        elif isinstance(node, SequenceNode):
            for item in node.value:
                if not isinstance(item, ScalarNode):
                    continue
                name, equals, raw = item.value.partition("=")
                if equals:
                    resolved, variables = self.interpolate(raw)
                    entries[name] = _EnvEntry(resolved, document.at(item), variables)
                else:
                    entries[name] = _EnvEntry(self.variables.get(name), document.at(item), (name,))
        return entries

    # -- rules on the YAML itself -----------------------------------------------------------------

    def _check_duplicate_keys(self, document: _Document) -> None:
        for mapping in _mappings(document.root):
            first: dict[str, Node] = {}
            for key, _value in mapping.value:
                if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
                    continue
                if key.value in first:
                    earlier = document.at(first[key.value])
                    self.add(
                        "error",
                        "duplicate-key",
                        f"`{key.value}` is given twice in this mapping (first at line {earlier.line}): "
                        "compose refuses the file",
                        document.at(key),
                        earlier,
                    )
                else:
                    first[key.value] = key

    def _check_interpolation(self, document: _Document) -> None:
        seen: set[tuple[int, str]] = set()
        for scalar in _scalars(document.root):
            if "$" not in scalar.value:
                continue
            interpolator = _Interpolator(self.variables)
            interpolator.expand(scalar.value)
            for severity, message in interpolator.problems:
                line = document.line_of(scalar)
                if (line, message) not in seen:
                    seen.add((line, message))
                    self.add(severity, "interpolation", message, Location(document.path, line))

    def _check_unquoted_numbers(self, document: _Document, node: Node | None, owner: str) -> None:
        if not isinstance(node, SequenceNode):
            return
        kinds = {_INT_TAG: "a number", _FLOAT_TAG: "a number", _BOOL_TAG: "a boolean", _NULL_TAG: "null"}
        for item in node.value:
            if isinstance(item, ScalarNode) and item.style is None and item.tag in kinds:
                self.add(
                    "error",
                    "unquoted-number",
                    f"YAML reads {item.value or '(empty)'} in this {owner} list as {kinds[item.tag]}: "
                    f'compose wants strings here, write "{item.value}"',
                    document.at(item),
                )

    # -- rules on services ------------------------------------------------------------------------

    def check_services(self) -> None:
        for service in self.services.values():
            self._check_duplicate_flags(service)
        engines = [service for service in self.services.values() if service.is_engine]
        priority_senders = self._priority_senders(engines)
        for engine in engines:
            self._check_memory_fraction(engine)
            self._check_speculative_decoding(engine)
            self._check_prefill_knobs(engine)
            self._check_fork_prefill_knobs(engine)
            self._check_scheduling_policy(engine, priority_senders.get(engine.name, []))
            self._check_prompt_tokens_details(engine)
            self._check_mamba_block_size(engine)
        for gateway in self.services.values():
            if gateway.is_gateway:
                self._check_max_inflight(gateway, engines)

    def _check_duplicate_flags(self, service: _Service) -> None:
        first: dict[str, _Flag] = {}
        for flag in service.flags:
            if flag.key in _REPEATABLE_FLAGS:
                continue
            earlier = first.get(flag.key)
            first[flag.key] = flag
            if earlier is None:
                continue
            self.add(
                "error",
                "duplicate-flag",
                f"`{flag.name}` {_shown(flag)} silently wins over `{earlier.name}` {_shown(earlier)} given "
                f"earlier at {_where(earlier.arg.location, flag.arg.location)}: give each flag once",
                flag.arg.location,
                earlier.arg.location,
            )

    def _check_memory_fraction(self, engine: _Service) -> None:
        flag = engine.last_flag("--gpu-memory-utilization")
        conf = next(
            (engine.environment[name] for name in _ALLOC_CONF_VARS if name in engine.environment), None
        )
        fraction = _alloc_conf_fraction(conf.value) if conf is not None and conf.value else None
        if flag is None and fraction is None:
            return
        if flag is None or fraction is None or conf is None:
            present = (
                "--gpu-memory-utilization"
                if flag is not None
                else "PYTORCH_ALLOC_CONF per_process_memory_fraction"
            )
            at = flag.arg.location if flag is not None else (conf.location if conf else engine.location)
            self.add(
                "warning",
                "memory-fraction-mismatch",
                f"{present} is set without its twin: set --gpu-memory-utilization and "
                "PYTORCH_ALLOC_CONF=per_process_memory_fraction:X from one variable",
                at,
            )
            return
        flag_at = flag.value_arg.location if flag.value_arg else flag.arg.location
        related = [
            conf.location,
            *self.env_lines((flag.value_arg.variables if flag.value_arg else ()) + conf.variables),
        ]
        try:
            utilization = float(flag.value or "")
            per_process = float(fraction)
        except ValueError:
            self.add(
                "error",
                "memory-fraction-mismatch",
                f"cannot compare --gpu-memory-utilization {flag.value!r} with per_process_memory_fraction "
                f"{fraction!r}: both must be numbers",
                flag_at,
                *related,
            )
            return
        if not math.isclose(utilization, per_process, rel_tol=0.0, abs_tol=1e-9):
            self.add(
                "error",
                "memory-fraction-mismatch",
                f"--gpu-memory-utilization {flag.value} differs from PYTORCH_ALLOC_CONF "
                f"per_process_memory_fraction {fraction} (at {_where(conf.location, flag_at)}): the engine "
                "OOMs at start; feed both from one .env variable",
                flag_at,
                *related,
            )

    def _check_speculative_decoding(self, engine: _Service) -> None:
        for flag in engine.flags:
            if not (flag.key.startswith("--speculative") or flag.key == "--num-speculative-tokens"):
                continue
            mtp = " (MTP)" if "mtp" in (flag.value or "").lower() else ""
            self.add(
                "error",
                "speculative-decoding",
                f"`{flag.name}` turns on speculative decoding{mtp}: on this workload MTP accepted 1.6 of 4 "
                "drafted tokens and made everything slower (and vLLM refuses it in Mamba cache mode 'align', "
                "which hybrid models use with prefix caching)",
                flag.arg.location,
            )

    def _check_prefill_knobs(self, engine: _Service) -> None:
        for flag in engine.flags:
            if flag.key not in _PREFILL_KNOBS:
                continue
            if flag.key == "--enable-chunked-prefill" and not flag.negated:
                continue  # turning on what is already the default changes nothing
            self.add(
                "warning",
                "prefill-scheduling",
                f"`{flag.name}` is a prefill-scheduling knob: the tuned Spark engine uses none (prefill is "
                "most of its token work, and the first token is what callers wait on)",
                flag.arg.location,
            )

    def _check_fork_prefill_knobs(self, engine: _Service) -> None:
        *earlier, last = _RATES_WITH_FORK_KNOBS
        rounds = f"{', '.join(map(str, earlier))} and {last}"
        for flag in engine.flags:
            if flag.key not in _FORK_PREFILL_KNOBS:
                continue
            self.add(
                "warning",
                "prefill-balancing",
                f"`{flag.name}` is one of the Spark vLLM fork's six prefill-balancing knobs: with them "
                f"the Spark served {rounds} requests/min in three measured rounds, against "
                f"{_RATE_WITHOUT_FORK_KNOBS} without, below the {_BUSINESS_MINIMUM} keyframes/min the "
                "business needs: the tuned engine sets none",
                flag.arg.location,
            )

    def _priority_senders(self, engines: list[_Service]) -> dict[str, list[_EnvEntry]]:
        """By engine name: where the gateways that send it priorities turn MODGATE_ENGINE__USE_PRIORITY on.

        A value the gateway cannot read as a boolean (it would refuse to start) is reported here.
        """
        senders: dict[str, list[_EnvEntry]] = {}
        for gateway in self.services.values():
            if not gateway.is_gateway:
                continue
            entry = _setting(gateway, USE_PRIORITY_VARIABLE)
            if entry is None or entry.value is None:  # unset: the default, off
                continue
            try:
                on = TypeAdapter(bool).validate_python(entry.value)  # as pydantic-settings reads it
            except ValidationError:
                self.add(
                    "error",
                    "scheduling-policy",
                    f"{USE_PRIORITY_VARIABLE} {entry.value!r} of `{gateway.name}` is not a boolean (true or "
                    "false): the gateway refuses to start",
                    entry.location,
                )
                continue
            if on:
                for engine in _engines_for(gateway, engines):
                    senders.setdefault(engine.name, []).append(entry)
        return senders

    def _check_scheduling_policy(self, engine: _Service, priority_senders: Sequence[_EnvEntry] = ()) -> None:
        """Priority scheduling is required only where a gateway sends priorities (use_priority on)."""
        flag = engine.last_flag("--scheduling-policy")
        if flag is not None and flag.value not in _SCHEDULING_POLICIES:
            self.add(
                "error",
                "scheduling-policy",
                f"--scheduling-policy {flag.value!r}: vLLM accepts only {' or '.join(_SCHEDULING_POLICIES)}",
                flag.arg.location,
            )
            return
        if not priority_senders or (flag is not None and flag.value == "priority"):
            return
        at = flag.arg.location if flag is not None else (engine.command_location or engine.location)
        where = ", ".join(_where(sender.location, at) for sender in priority_senders)
        policy = "--scheduling-policy fcfs" if flag else "no --scheduling-policy (vLLM's default fcfs)"
        self.add(
            "error",
            "scheduling-policy",
            f"{policy} rejects every request whose priority is not 0, and the gateway sends priorities "
            f"({USE_PRIORITY_VARIABLE} is on at {where}): add --scheduling-policy priority, or turn "
            "use_priority off",
            at,
            *(sender.location for sender in priority_senders),
        )

    def _check_prompt_tokens_details(self, engine: _Service) -> None:
        flag = engine.last_flag("--enable-prompt-tokens-details")
        if flag is not None and not flag.negated:
            return
        self.add(
            "error",
            "prompt-tokens-details",
            "--enable-prompt-tokens-details is missing: usage.prompt_tokens_details.cached_tokens, the "
            "per-request truth about prefix-cache hits, comes back null and reads as 0",
            flag.arg.location if flag is not None else (engine.command_location or engine.location),
        )

    def _check_mamba_block_size(self, engine: _Service) -> None:
        flag = engine.last_flag("--mamba-block-size")
        if flag is None:
            return
        at = flag.value_arg.location if flag.value_arg else flag.arg.location
        try:
            size = int(flag.value or "")
        except ValueError:
            size = 0
        if size <= 0 or size % _CONV_KERNEL_ALIGNMENT:
            self.add(
                "error",
                "mamba-block-size",
                f"--mamba-block-size {flag.value!r} must be a positive multiple of {_CONV_KERNEL_ALIGNMENT} "
                "(vLLM aligns Mamba blocks to its causal_conv1d kernel)",
                at,
            )
            return
        prefix = engine.last_flag("--enable-prefix-caching")
        if prefix is None or prefix.negated:
            self.add(
                "warning",
                "mamba-block-size",
                f"--mamba-block-size {size} without --enable-prefix-caching has no effect: vLLM keeps one "
                "Mamba block per sequence",
                at,
            )
            return
        mode = engine.last_flag("--mamba-cache-mode")
        if mode is not None and mode.value == "align":
            self.add(
                "warning",
                "mamba-block-size",
                f"--mamba-block-size {size} is ignored with --mamba-cache-mode align: vLLM sets the Mamba "
                "block to the attention block size",
                at,
            )
        elif size % _ATTENTION_KERNEL_ALIGNMENT:
            aligned = math.lcm(size, _ATTENTION_KERNEL_ALIGNMENT)
            self.add(
                "warning",
                "mamba-block-size",
                f"--mamba-block-size {size} is not a multiple of {_ATTENTION_KERNEL_ALIGNMENT}: vLLM "
                f"re-aligns it to a multiple of lcm({size}, kernel alignment) = {aligned} or more, rounded "
                "up to hold a whole Mamba state, so the block used is not the one written (in 'align' "
                "mode, the default for models without full Mamba prefix caching, the attention block size "
                "replaces it)",
                at,
            )

    def _check_max_inflight(self, gateway: _Service, engines: list[_Service]) -> None:
        engine = _engine_for(gateway, engines)
        if engine is None:
            return
        seqs_flag = engine.last_flag("--max-num-seqs")
        if seqs_flag is None or seqs_flag.value is None:
            return  # vLLM's default (256 or more) is above any sane gateway bound
        entry = gateway.environment.get("MODGATE_MAX_INFLIGHT")
        raw = entry.value if entry is not None and entry.value else str(DEFAULT_MAX_INFLIGHT)
        at = entry.location if entry is not None else gateway.location
        try:
            inflight, max_num_seqs = int(raw), int(seqs_flag.value)
        except ValueError:
            self.add(
                "error",
                "max-inflight",
                f"cannot compare MODGATE_MAX_INFLIGHT {raw!r} with --max-num-seqs {seqs_flag.value!r}: "
                "both must be whole numbers",
                at,
            )
            return
        if inflight > max_num_seqs:
            seqs_at = seqs_flag.value_arg.location if seqs_flag.value_arg else seqs_flag.arg.location
            default = "" if entry is not None else f" (the default, {DEFAULT_MAX_INFLIGHT})"
            self.add(
                "error",
                "max-inflight",
                f"MODGATE_MAX_INFLIGHT {inflight}{default} of `{gateway.name}` is above --max-num-seqs "
                f"{max_num_seqs} of `{engine.name}` (at {_where(seqs_at, at)}): the excess queues inside the "
                "engine, outside the gateway's priority queue and deadlines",
                at,
                seqs_at,
            )


def _where(place: Location, seen_from: Location) -> str:
    """`line N` within the same file, `name:N` in another (messages stay short; findings carry full paths)."""
    if place.file == seen_from.file:
        return f"line {place.line}"
    return f"{place.file.name}:{place.line}"


def _shown(flag: _Flag) -> str:
    return f"{flag.value!r}" if flag.value is not None else "(a switch)"


def _engine_for(gateway: _Service, engines: list[_Service]) -> _Service | None:
    """The engine service the gateway's MODGATE_ENGINE_URL names, or the only engine there is."""
    entry = gateway.environment.get("MODGATE_ENGINE_URL")
    host = urlsplit(entry.value).hostname if entry is not None and entry.value else None
    named = next((engine for engine in engines if engine.name == host), None)
    if named is not None:
        return named
    return engines[0] if len(engines) == 1 else None


def _engines_for(gateway: _Service, engines: list[_Service]) -> list[_Service]:
    """Every engine service the gateway's MODGATE_ENGINE_URL names (a comma-separated list); when it names
    none of them, the only engine there is, or every engine (which one is meant cannot be told)."""
    entry = gateway.environment.get("MODGATE_ENGINE_URL")
    urls = entry.value.split(",") if entry is not None and entry.value else []
    hosts = {urlsplit(url.strip()).hostname for url in urls}
    named = [engine for engine in engines if engine.name in hosts]
    return named or list(engines)


def _setting(service: _Service, name: str) -> _EnvEntry | None:
    """A MODGATE_* variable as pydantic-settings reads it: its name in any case, the last one winning."""
    found = [entry for key, entry in service.environment.items() if key.upper() == name]
    return found[-1] if found else None


def _alloc_conf_fraction(conf: str) -> str | None:
    """`per_process_memory_fraction` from a PYTORCH_ALLOC_CONF like `a:1,per_process_memory_fraction:0.8`."""
    for part in conf.split(","):
        key, _colon, value = part.partition(":")
        if key.strip() == "per_process_memory_fraction":
            return value.strip()
    return None


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and _NUMBER.fullmatch(word) is None


def _flag_key(name: str) -> str:
    if not name.startswith("--"):
        return name
    body = name[2:].replace("_", "-")
    return "--" + body.removeprefix("no-")


def _takes_value(name: str) -> bool:
    normalized = name.replace("_", "-")
    return not (normalized.startswith(_VALUELESS_PREFIXES) or normalized in _VALUELESS_FLAGS)


def _parse_flags(args: Sequence[_Arg]) -> list[_Flag]:
    """Flags as vLLM's argparse reads them: `--name=value`, `--name value`, or a bare switch."""
    flags: list[_Flag] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not _is_flag(arg.value):
            continue
        name, equals, inline = arg.value.partition("=")
        value: str | None = None
        value_arg: _Arg | None = None
        if equals:
            value, value_arg = inline, arg
        elif _takes_value(name) and index < len(args) and not _is_flag(args[index].value):
            value_arg = args[index]
            value = value_arg.value
            index += 1
        flags.append(_Flag(name, _flag_key(name), value, arg, value_arg))
    return flags


# --- docker compose config ---------------------------------------------------------------------------

_NOT_USABLE = "skipped: docker compose not usable"


def run_compose_config(compose_files: Sequence[Path], env_file: Path | None) -> tuple[str, list[Finding]]:
    """`docker compose config -q` when the compose client works (it needs no engine), else a skip note."""
    docker = shutil.which("docker")
    if docker is None:
        return f"{_NOT_USABLE} (no docker client)", []
    try:
        version = subprocess.run(  # noqa: S603 - a fixed argument list, no shell
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return _NOT_USABLE, []
    if version.returncode != 0:
        return _NOT_USABLE, []
    command = [docker, "compose", "--project-directory", str(compose_files[0].parent)]
    for path in compose_files:
        command += ["-f", str(path)]
    if env_file is not None:
        command += ["--env-file", str(env_file)]
    try:
        result = subprocess.run(  # noqa: S603 - a fixed argument list, no shell
            [*command, "config", "-q"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{_NOT_USABLE} ({exc})", []
    if result.returncode == 0:
        return "passed", []
    message = " ".join((result.stderr or result.stdout).split()) or f"exit status {result.returncode}"
    return "failed", [
        Finding("error", "compose-config", f"docker compose config -q: {message}", Location(compose_files[0]))
    ]


# --- entry point -------------------------------------------------------------------------------------


def check_deploy(
    compose_files: Sequence[Path],
    *,
    env_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    compose_config: bool = True,
) -> CheckReport:
    """Run every rule over the compose files (merged in order, like `docker compose -f a -f b`).

    `env_file` defaults to `.env` beside the first compose file, else `.env.example` there (with a
    warning). `environ` is the shell environment that overrides `.env` (pass `os.environ`).
    Raises UnreadableInputError when an input cannot be read or parsed.
    """
    if not compose_files:
        raise UnreadableInputError("no compose file given")
    documents = [_load_document(path) for path in compose_files]
    findings: list[Finding] = []
    project = compose_files[0].parent
    if env_file is None:
        if (project / ".env").is_file():
            env_file = project / ".env"
        elif (project / ".env.example").is_file():
            env_file = project / ".env.example"
            findings.append(
                Finding(
                    "warning",
                    "env-file",
                    f"no .env beside {compose_files[0].name}: variables resolved from .env.example "
                    "(cp .env.example .env before starting)",
                    Location(env_file),
                )
            )
    elif not env_file.is_file():
        raise UnreadableInputError(f"{env_file}: no such file")
    environment = dict(environ or {})
    dotenv = _read_dotenv(env_file, environment, findings) if env_file is not None else None
    checker = _Checker(documents, dotenv, environment)
    checker.read()
    checker.check_services()
    findings += checker.findings
    status = "skipped: --skip-compose-config"
    if compose_config:
        status, config_findings = run_compose_config(compose_files, env_file)
        findings += config_findings
    order = {path: index for index, path in enumerate([*compose_files, *([env_file] if env_file else [])])}
    findings.sort(key=lambda f: (order.get(f.location.file, len(order)), f.location.line or 0, f.rule))
    return CheckReport(tuple(compose_files), env_file, tuple(findings), status)


# --- the engine's flags, for `deploy predict` ----------------------------------------------------------


@dataclass(frozen=True)
class EngineFlag:
    """One flag of an engine service as vLLM's parser reads it (see the module docstring)."""

    name: str  # as written, e.g. --max_num_seqs or --no-enable-chunked-prefill
    key: str  # as matched, e.g. --max-num-seqs, --enable-chunked-prefill
    value: str | None
    negated: bool
    location: Location


@dataclass(frozen=True)
class ServiceFlags:
    """A compose service's flags and environment, merged and interpolated as `deploy check` reads them."""

    name: str
    is_engine: bool
    is_gateway: bool
    flags: tuple[EngineFlag, ...]
    environment: dict[str, str | None]

    def last(self, key: str) -> EngineFlag | None:
        """The flag that wins for ``key`` (the last one given)."""
        return next((flag for flag in reversed(self.flags) if flag.key == key), None)


def read_services(
    compose_files: Sequence[Path], *, env_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[ServiceFlags]:
    """Every service's flags, read exactly as `check_deploy` reads them (same merge, `.env` and parser)."""
    if not compose_files:
        raise UnreadableInputError("no compose file given")
    documents = [_load_document(path) for path in compose_files]
    project = compose_files[0].parent
    if env_file is None:
        env_file = next((project / name for name in (".env", ".env.example") if (project / name).is_file()),
                        None)
    elif not env_file.is_file():
        raise UnreadableInputError(f"{env_file}: no such file")
    environment = dict(environ or {})
    dotenv = _read_dotenv(env_file, environment, []) if env_file is not None else None
    checker = _Checker(documents, dotenv, environment)
    checker.read()
    return [
        ServiceFlags(
            name=service.name,
            is_engine=service.is_engine,
            is_gateway=service.is_gateway,
            flags=tuple(
                EngineFlag(flag.name, flag.key, flag.value, flag.negated, flag.arg.location)
                for flag in service.flags
            ),
            environment={name: entry.value for name, entry in service.environment.items()},
        )
        for service in checker.services.values()
    ]
