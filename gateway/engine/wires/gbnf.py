"""A verdict regex as a GBNF grammar, the form llama.cpp's server holds output to (``grammar``).

The gateway writes its verdict constraints once, as regexes (shaping/verdict.py); vLLM takes them as they
are, llama.cpp takes GBNF. This translates the subset those regexes use: literals, ``\\`` escapes,
``( | )`` groups, character classes and the ``? * + {m} {m,n}`` quantifiers. Anything else is refused
with a ValueError naming it, so a new construct is found by a test, not by the engine.
"""

from __future__ import annotations

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}
_QUANTIFIERS = "?*+{"


def _literal(text: str) -> str:
    """A GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped.replace(chr(13), chr(92) + "r")}"'


class _Parser:
    """Recursive descent over the regex: alternation, sequence, quantified atom."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.at = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{what} at {self.at} of the regex {self.pattern!r}: not translatable to GBNF")

    def peek(self) -> str:
        return self.pattern[self.at] if self.at < len(self.pattern) else ""

    def alternation(self) -> str:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else "(" + " | ".join(branches) + ")"

    def sequence(self) -> str:
        items: list[str] = []
        while self.peek() not in {"", "|", ")"}:
            atom, literal = self.atom()
            quantifier = self.quantifier()
            if literal is not None and not quantifier and items and items[-1].startswith('"'):
                items[-1] = _literal(_unquote(items[-1]) + literal)  # runs of literals as one string
            else:
                items.append(atom + quantifier)
        return " ".join(items) if items else '""'

    def atom(self) -> tuple[str, str | None]:
        char = self.peek()
        if char == "(":
            self.at += 1
            if self.pattern.startswith("?:", self.at):
                self.at += 2
            inner = self.alternation()
            if self.peek() != ")":
                raise self.fail("an unclosed group")
            self.at += 1
            return f"({inner})", None
        if char == "[":
            end = self.pattern.find("]", self.at + 1)
            if end < 0:
                raise self.fail("an unclosed character class")
            body = self.pattern[self.at : end + 1]
            self.at = end + 1
            return body, None
        if char == "\\":
            escaped = self.pattern[self.at + 1 : self.at + 2]
            if not escaped:
                raise self.fail("a trailing backslash")
            self.at += 2
            if escaped.isalnum() and escaped not in _ESCAPES:
                raise self.fail(f"the class escape \\{escaped}")
            text = _ESCAPES.get(escaped, escaped)
            return _literal(text), text
        if char in "^$.":
            raise self.fail(f"the anchor or wildcard {char!r}")
        if char in _QUANTIFIERS:
            raise self.fail(f"a quantifier {char!r} with nothing before it")
        self.at += 1
        return _literal(char), char

    def quantifier(self) -> str:
        char = self.peek()
        if char in {"?", "*", "+"}:
            self.at += 1
            return char
        if char == "{":
            end = self.pattern.find("}", self.at)
            if end < 0:
                raise self.fail("an unclosed repetition")
            body = self.pattern[self.at + 1 : end]
            if not body.replace(",", "").isdigit() or body.count(",") > 1:
                raise self.fail(f"the repetition {{{body}}}")
            self.at = end + 1
            return "{" + body + "}"
        return ""


def _unquote(literal: str) -> str:
    """The text of a GBNF string literal written by :func:`_literal`."""
    inner = literal[1:-1]
    out, index = [], 0
    while index < len(inner):
        if inner[index] == "\\":
            out.append({"n": "\n", "t": "\t", "r": "\r"}.get(inner[index + 1], inner[index + 1]))
            index += 2
        else:
            out.append(inner[index])
            index += 1
    return "".join(out)


def regex_to_gbnf(pattern: str) -> str:
    """A GBNF grammar whose ``root`` matches exactly the strings ``pattern`` fully matches."""
    parser = _Parser(pattern)
    expression = parser.alternation()
    if parser.at != len(pattern):
        raise parser.fail(f"an unmatched {parser.peek()!r}")
    return f"root ::= {expression}\n"
