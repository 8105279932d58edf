"""The vocabulary of `deploy check`: places, findings, the report, and compose services with their flags."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal, TypeVar

from gateway.renamed_settings import deprecated_env_names

Severity = Literal["error", "warning"]

DEFAULT_MAX_INFLIGHT = 8  # the gateway's default MODGATE_ENGINE__MAX_INFLIGHT (docs/spark.md)
_REPLACED = {new: old for old, new in deprecated_env_names().items()}
_Value = TypeVar("_Value")


def gateway_setting(environment: Mapping[str, _Value], name: str) -> _Value | None:
    """A gateway setting as the gateway reads it: by its name, else by the deprecated name it replaced."""
    if name in environment:
        return environment[name]
    old = _REPLACED.get(name)
    return environment.get(old) if old else None

# Boolean switches of vLLM and llama.cpp's server that take no value, so the token after them is not read as
# theirs.
_VALUELESS_PREFIXES = ("--enable-", "--disable-", "--no-")
_VALUELESS_FLAGS = frozenset({
    "--trust-remote-code", "--enforce-eager", "--headless", "--allow-credentials",
    # llama-server (common/arg.cpp)
    "--jinja", "--metrics", "--props", "--slots", "--kv-unified", "-kvu", "-no-kvu", "--cont-batching", "-cb",
    "-nocb", "--swa-full", "--mlock", "--cache-prompt", "--cache-idle-slots", "--context-shift", "--verbose",
})
EngineKind = Literal["vllm", "llamacpp"]
_NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?")


class UnreadableInputError(Exception):
    """A compose file or `.env` that cannot be read or parsed at all (exit status 2)."""


@dataclass(frozen=True)
class Location:
    """A place in an input file; `line` is 1-based, None when the finding concerns the whole file."""

    file: Path
    line: int | None = None


def where(place: Location, seen_from: Location) -> str:
    """`line N` within the same file, `name:N` in another (messages stay short; findings carry full paths)."""
    if place.file == seen_from.file:
        return f"line {place.line}"
    return f"{place.file.name}:{place.line}"


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


# --- services, arguments, flags (as the rules see them) ------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """One word of an entrypoint or command."""

    value: str  # after interpolation
    location: Location
    variables: tuple[str, ...]  # the ${VAR}s it was built from


@dataclass(frozen=True)
class Flag:
    """One CLI flag of a service, with the word that holds its value (if any)."""

    name: str  # as written, e.g. --max_num_seqs
    key: str  # as vLLM's parser matches it, e.g. --max-num-seqs (--no-x and --x share --x)
    value: str | None
    arg: Arg
    value_arg: Arg | None

    @property
    def negated(self) -> bool:
        """`--no-x`: the switch turned off."""
        return self.name.replace("_", "-").startswith("--no-")


@dataclass(frozen=True)
class EnvEntry:
    """One variable of a service's `environment:`."""

    value: str | None  # None: passed through from the host environment but unset there
    location: Location
    variables: tuple[str, ...]


@dataclass
class Service:
    """A compose service after every compose file is merged and every `${VAR}` resolved."""

    name: str
    location: Location
    image: str = ""
    entrypoint: list[Arg] = field(default_factory=list)
    command: list[Arg] = field(default_factory=list)
    command_location: Location | None = None
    environment: dict[str, EnvEntry] = field(default_factory=dict)

    @property
    def args(self) -> list[Arg]:
        return self.entrypoint + self.command

    @cached_property
    def flags(self) -> list[Flag]:
        """Parsed once all compose files are merged (the rules run after reading)."""
        return parse_flags(self.args)

    def last_flag(self, key: str) -> Flag | None:
        return next((flag for flag in reversed(self.flags) if flag.key == key), None)

    @property
    def engine_kind(self) -> EngineKind | None:
        """vLLM or llama.cpp's server, from the image or the first words of the command; None: no engine."""
        words = " ".join(arg.value for arg in self.args[:3]).lower()
        image = self.image.lower()
        if "vllm" in image or "vllm" in words:
            return "vllm"
        if any(name in text for name in ("llama.cpp", "llama-server") for text in (image, words)):
            return "llamacpp"
        return None

    @property
    def is_engine(self) -> bool:
        return self.engine_kind is not None

    @property
    def is_gateway(self) -> bool:
        return any(name.startswith("MODGATE_") for name in self.environment) or any(
            "modgate" in arg.value for arg in self.args[:2]
        )


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


def parse_flags(args: Sequence[Arg]) -> list[Flag]:
    """Flags as vLLM's argparse reads them: `--name=value`, `--name value`, or a bare switch."""
    flags: list[Flag] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not _is_flag(arg.value):
            continue
        name, equals, inline = arg.value.partition("=")
        value: str | None = None
        value_arg: Arg | None = None
        if equals:
            value, value_arg = inline, arg
        elif _takes_value(name) and index < len(args) and not _is_flag(args[index].value):
            value_arg = args[index]
            value = value_arg.value
            index += 1
        flags.append(Flag(name, _flag_key(name), value, arg, value_arg))
    return flags


# --- the public view of a service, for `deploy predict` -------------------------------------------------


@dataclass(frozen=True)
class EngineFlag:
    """One flag of an engine service as vLLM's parser reads it (see the package docstring)."""

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
    engine_kind: EngineKind | None = None

    def last(self, key: str) -> EngineFlag | None:
        """The flag that wins for ``key`` (the last one given)."""
        return next((flag for flag in reversed(self.flags) if flag.key == key), None)
