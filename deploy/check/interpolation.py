"""Compose's variable interpolation, with what went wrong kept as problems for the `interpolation` rule."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from deploy.check.model import Severity

VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL)


@dataclass
class Interpolator:
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
            elif (name := VAR_NAME.match(text, index + 1)) is not None:
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
