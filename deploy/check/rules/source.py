"""Rules on the YAML as written, before any merge: duplicate keys, interpolation, unquoted numbers."""

from __future__ import annotations

from collections.abc import Iterator

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from deploy.check.compose import Deployment
from deploy.check.interpolation import Interpolator
from deploy.check.loader import (
    BOOL_TAG,
    FLOAT_TAG,
    INT_TAG,
    MERGE_TAG,
    NULL_TAG,
    Document,
    get,
    mappings,
    pairs,
    scalars,
)
from deploy.check.model import Finding, Location

_KINDS = {INT_TAG: "a number", FLOAT_TAG: "a number", BOOL_TAG: "a boolean", NULL_TAG: "null"}


def duplicate_keys(deployment: Deployment) -> Iterator[Finding]:
    """duplicate-key: a key given twice in one mapping (compose refuses it; PyYAML keeps the later)."""
    for document in deployment.documents:
        for mapping in mappings(document.root):
            first: dict[str, Node] = {}
            for key, _value in mapping.value:
                if not isinstance(key, ScalarNode) or key.tag == MERGE_TAG:
                    continue
                if key.value in first:
                    earlier = document.at(first[key.value])
                    yield Finding(
                        "error",
                        "duplicate-key",
                        f"`{key.value}` is given twice in this mapping (first at line {earlier.line}): "
                        "compose refuses the file",
                        document.at(key),
                        (earlier,),
                    )
                else:
                    first[key.value] = key


def interpolation(deployment: Deployment) -> Iterator[Finding]:
    """interpolation: a required variable unset, a malformed `${...}`, or a plain `${VAR}` unset."""
    for document in deployment.documents:
        seen: set[tuple[int, str]] = set()
        for scalar in scalars(document.root):
            if "$" not in scalar.value:
                continue
            interpolator = Interpolator(deployment.variables)
            interpolator.expand(scalar.value)
            for severity, message in interpolator.problems:
                line = document.line_of(scalar)
                if (line, message) not in seen:
                    seen.add((line, message))
                    yield Finding(severity, "interpolation", message, Location(document.path, line))


def unquoted_numbers(deployment: Deployment) -> Iterator[Finding]:
    """unquoted-number: a command, entrypoint or healthcheck-test item that YAML reads as a non-string."""
    for document in deployment.documents:
        services = get(document.root, "services")
        assert isinstance(services, MappingNode)  # load_document made sure
        for _key, body in pairs(services):
            if not isinstance(body, MappingNode):
                continue
            for owner in ("entrypoint", "command"):
                yield from _unquoted_in(document, get(body, owner), owner)
            yield from _unquoted_in(document, get(get(body, "healthcheck"), "test"), "healthcheck test")


def _unquoted_in(document: Document, node: Node | None, owner: str) -> Iterator[Finding]:
    if not isinstance(node, SequenceNode):
        return
    for item in node.value:
        if isinstance(item, ScalarNode) and item.style is None and item.tag in _KINDS:
            yield Finding(
                "error",
                "unquoted-number",
                f"YAML reads {item.value or '(empty)'} in this {owner} list as {_KINDS[item.tag]}: "
                f'compose wants strings here, write "{item.value}"',
                document.at(item),
            )
