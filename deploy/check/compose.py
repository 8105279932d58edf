"""Compose files merged into services, as `docker compose -f a -f b` merges them, every `${VAR}` resolved."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from deploy.check.interpolation import Interpolator
from deploy.check.loader import NULL_TAG, Document, DotEnv, get, load_document, pairs, read_dotenv
from deploy.check.model import (
    Arg,
    EngineFlag,
    EnvEntry,
    Finding,
    Location,
    Service,
    ServiceFlags,
    UnreadableInputError,
)


@dataclass
class Deployment:
    """What the rules look at: the documents as written, the `.env`, and the merged services."""

    documents: list[Document]
    dotenv: DotEnv | None
    variables: dict[str, str]  # compose's precedence: the shell environment overrides .env
    from_dotenv: set[str]  # the variables whose value came from .env
    services: dict[str, Service] = field(default_factory=dict)
    problems: list[Finding] = field(default_factory=list)  # found while reading (command-syntax)

    @property
    def engines(self) -> list[Service]:
        """The vLLM engines: the services the vLLM flag rules read."""
        return [service for service in self.services.values() if service.engine_kind == "vllm"]

    @property
    def llamacpp_engines(self) -> list[Service]:
        """The llama.cpp servers (rules in `rules/llamacpp.py`)."""
        return [service for service in self.services.values() if service.engine_kind == "llamacpp"]

    @property
    def gateways(self) -> list[Service]:
        return [service for service in self.services.values() if service.is_gateway]

    def env_lines(self, variables: Sequence[str]) -> list[Location]:
        """Where in .env the given variables were set (to point at the line to edit)."""
        if self.dotenv is None:
            return []
        return [
            Location(self.dotenv.path, self.dotenv.lines[name])
            for name in variables
            if name in self.from_dotenv
        ]


def read_deployment(
    documents: list[Document], dotenv: DotEnv | None, environ: Mapping[str, str]
) -> Deployment:
    """Merge the documents' services in order; later files override earlier ones key by key."""
    deployment = Deployment(
        documents,
        dotenv,
        variables={**(dotenv.values if dotenv else {}), **environ},
        from_dotenv={name for name in (dotenv.values if dotenv else {}) if name not in environ},
    )
    reader = _Reader(deployment)
    for document in documents:
        services = get(document.root, "services")
        assert isinstance(services, MappingNode)  # load_document made sure
        for key, body in pairs(services):
            if isinstance(body, MappingNode):
                reader.merge_service(document, str(key.value), document.at(key), body)
    return deployment


def default_env_file(project: Path, compose_name: str = "compose.yaml") -> Path | None:
    """`.env` beside the first compose file, else `.env.example` there, as `deploy check` falls back.

    A variant `compose.NAME.yaml` reads `.env.NAME` (else `.env.NAME.example`) first: its own variables,
    passed to compose with `--env-file .env.NAME`.
    """
    names = [".env", ".env.example"]
    parts = compose_name.split(".")
    if len(parts) == 3 and parts[0] in ("compose", "docker-compose"):
        names = [f".env.{parts[1]}", f".env.{parts[1]}.example", *names]
    return next((project / name for name in names if (project / name).is_file()), None)


def read_services(
    compose_files: Sequence[Path], *, env_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[ServiceFlags]:
    """Every service's flags, read exactly as `check_deploy` reads them (same merge, `.env` and parser)."""
    if not compose_files:
        raise UnreadableInputError("no compose file given")
    documents = [load_document(path) for path in compose_files]
    if env_file is None:
        env_file = default_env_file(compose_files[0].parent, compose_files[0].name)
    elif not env_file.is_file():
        raise UnreadableInputError(f"{env_file}: no such file")
    environment = dict(environ or {})
    dotenv = read_dotenv(env_file, environment, []) if env_file is not None else None
    deployment = read_deployment(documents, dotenv, environment)
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
            engine_kind=service.engine_kind,
        )
        for service in deployment.services.values()
    ]


@dataclass
class _Reader:
    deployment: Deployment

    def interpolate(self, text: str) -> tuple[str, tuple[str, ...]]:
        """A value and the variables it used; its problems are reported once, by the interpolation rule."""
        interpolator = Interpolator(self.deployment.variables)
        return interpolator.expand(text), tuple(interpolator.used)

    def merge_service(self, document: Document, name: str, at: Location, body: MappingNode) -> None:
        """Later compose files override earlier ones key by key, as `docker compose -f a -f b` does."""
        service = self.deployment.services.setdefault(name, Service(name, at))
        image = get(body, "image")
        if isinstance(image, ScalarNode):
            service.image = self.interpolate(image.value)[0]
        entrypoint = get(body, "entrypoint")
        if entrypoint is not None:
            service.entrypoint = self._args(document, entrypoint)
        command = get(body, "command")
        if command is not None:
            service.command = self._args(document, command)
            service.command_location = document.at(command)
        environment = get(body, "environment")
        if environment is not None:
            service.environment.update(self._environment(document, environment))

    def _args(self, document: Document, node: Node) -> list[Arg]:
        if isinstance(node, SequenceNode):
            args = []
            for item in node.value:
                if isinstance(item, ScalarNode) and item.tag != NULL_TAG:
                    value, variables = self.interpolate(item.value)
                    args.append(Arg(value, document.at(item), variables))
            return args
        if isinstance(node, ScalarNode) and node.tag != NULL_TAG:
            return self._split_command_string(document, node)
        return []

    def _split_command_string(self, document: Document, node: ScalarNode) -> list[Arg]:
        """Split a command string as compose does, and find each word's line in the source text.

        Words are split before interpolation so that each can be traced to its line; compose splits
        after, which differs only when a variable's value holds spaces or quotes.
        """
        try:
            words = shlex.split(node.value)
        except ValueError as exc:
            self.deployment.problems.append(
                Finding(
                    "error",
                    "command-syntax",
                    f"cannot split this command like a shell line: {exc}",
                    document.at(node),
                )
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
            args.append(Arg(value, Location(document.path, line), variables))
        return args

    def _environment(self, document: Document, node: Node) -> dict[str, EnvEntry]:
        entries: dict[str, EnvEntry] = {}
        variables = self.deployment.variables
        if isinstance(node, MappingNode):
            for key, value in pairs(node):
                if not isinstance(key, ScalarNode):
                    continue
                if isinstance(value, ScalarNode) and value.tag != NULL_TAG:
                    resolved, used = self.interpolate(value.value)
                    entries[key.value] = EnvEntry(resolved, document.at(key), used)
                else:  # `KEY:` alone passes the host's value through
                    entries[key.value] = EnvEntry(variables.get(key.value), document.at(key), (key.value,))
        elif isinstance(node, SequenceNode):
            for item in node.value:
                if not isinstance(item, ScalarNode):
                    continue
                name, equals, raw = item.value.partition("=")
                if equals:
                    resolved, used = self.interpolate(raw)
                    entries[name] = EnvEntry(resolved, document.at(item), used)
                else:
                    entries[name] = EnvEntry(variables.get(name), document.at(item), (name,))
        return entries
