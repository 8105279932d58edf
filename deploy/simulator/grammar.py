"""A llama.cpp GBNF grammar as a Python regex, so the simulated llama-server can check what it may write.

llama.cpp holds sampling to a ``grammar`` (GBNF, grammars/README.md in its tree) from the first generated
token. The simulator writes whole answers, so it needs only to know whether a text is one the grammar
admits: a grammar without recursion is a regular language, and this writes it as one regex. It reads
what GBNF has: rules ``name ::= expr`` (a rule may span lines), ``# comments``, string literals with
``\\n \\t \\r \\\\ \\" \\xHH`` escapes, character classes (``[^<]``, ranges, escapes), ``.``, rule
references, ``( | )`` groups and the ``? * + {m} {m,} {m,n}`` repetitions. A recursive rule, an unknown
rule or a construct it cannot read is a ValueError naming it (the route answers it as llama-server answers
a grammar it cannot parse: a 400).
"""

from __future__ import annotations

import re
from functools import cache

_RULE_START = re.compile(r"^[ \t]*([a-zA-Z0-9_-]+)[ \t]*::=", re.MULTILINE)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^"}


def _rules(grammar: str) -> dict[str, str]:
    """Each rule's right-hand side, comments dropped (a ``#`` inside a literal or class is kept)."""
    text = _without_comments(grammar)
    starts = list(_RULE_START.finditer(text))
    if not starts:
        raise ValueError("the grammar defines no rule (expected `root ::= ...`)")
    rules: dict[str, str] = {}
    for index, found in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
        rules[found.group(1)] = text[found.end() : end]
    return rules


def _without_comments(grammar: str) -> str:
    out: list[str] = []
    quote: str | None = None
    at = 0
    while at < len(grammar):
        char = grammar[at]
        if quote is None and char == "#":
            while at < len(grammar) and grammar[at] != "\n":
                at += 1
            continue
        if quote is not None and char == "\\":
            out.append(grammar[at : at + 2])
            at += 2
            continue
        if quote is None and char in "\"[":
            quote = '"' if char == '"' else "]"
        elif quote is not None and char == quote:
            quote = None
        out.append(char)
        at += 1
    return "".join(out)


class _Translator:
    """Recursive descent over one rule's body, rule references expanded inline."""

    def __init__(self, rules: dict[str, str]) -> None:
        self.rules = rules
        self.done: dict[str, str] = {}
        self.open: list[str] = []
        self.fixed = True  # no choice anywhere (alternation, repetition, class): the grammar admits one text

    def rule(self, name: str) -> str:
        if name in self.done:
            return self.done[name]
        if name in self.open:
            raise ValueError(f"the rule {name!r} is recursive: not a regular language to check")
        if name not in self.rules:
            raise ValueError(f"the grammar uses the undefined rule {name!r}")
        self.open.append(name)
        body = _Body(self, self.rules[name], name)
        expression = body.alternation()
        body.skip_space()
        if body.at != len(body.text):
            raise body.fail(f"an unexpected {body.text[body.at]!r}")
        self.open.pop()
        self.done[name] = f"(?:{expression})"
        return self.done[name]


class _Body:
    def __init__(self, translator: _Translator, text: str, name: str) -> None:
        self.translator = translator
        self.text = text
        self.name = name
        self.at = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{what} at {self.at} of the rule {self.name!r}: not a grammar the simulator reads")

    def skip_space(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\r\n":
            self.at += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.at] if self.at < len(self.text) else ""

    def alternation(self) -> str:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        if len(branches) == 1:
            return branches[0]
        self.translator.fixed = False
        return "(?:" + "|".join(branches) + ")"

    def sequence(self) -> str:
        items: list[str] = []
        while self.peek() not in {"", "|", ")"}:
            items.append(self.atom() + self.repetition())
        return "".join(items)

    def atom(self) -> str:
        char = self.peek()
        if char == "(":
            self.at += 1
            inner = self.alternation()
            if self.peek() != ")":
                raise self.fail("an unclosed group")
            self.at += 1
            return f"(?:{inner})"
        if char == '"':
            return re.escape(self.literal())
        if char == "[":
            self.translator.fixed = False
            return self.char_class()
        if char == ".":
            self.at += 1
            self.translator.fixed = False
            return "(?s:.)"
        name = re.match(r"[a-zA-Z0-9_-]+", self.text[self.at :])
        if name is None:
            raise self.fail(f"an unexpected {char!r}")
        self.at += name.end()
        return self.translator.rule(name.group())

    def escaped(self) -> str:
        """The character after a backslash (the backslash already read)."""
        code = self.text[self.at : self.at + 1]
        if code == "x":
            digits = self.text[self.at + 1 : self.at + 3]
            self.at += 3
            return chr(int(digits, 16))
        if code not in _ESCAPES:
            raise self.fail(f"the escape \\{code}")
        self.at += 1
        return _ESCAPES[code]

    def literal(self) -> str:
        self.at += 1  # the opening quote
        out: list[str] = []
        while self.at < len(self.text) and self.text[self.at] != '"':
            char = self.text[self.at]
            self.at += 1
            out.append(self.escaped() if char == "\\" else char)
        if self.at >= len(self.text):
            raise self.fail("an unclosed string literal")
        self.at += 1
        return "".join(out)

    def char_class(self) -> str:
        self.at += 1  # the opening bracket
        negated = self.text.startswith("^", self.at)
        self.at += negated
        parts: list[str] = []
        while self.at < len(self.text) and self.text[self.at] != "]":
            char = self.text[self.at]
            self.at += 1
            if char == "\\":
                parts.append(re.escape(self.escaped()))
            elif char == "-" and parts and self.at < len(self.text) and self.text[self.at] != "]":
                parts.append("-")
            else:
                parts.append(re.escape(char))
        if self.at >= len(self.text):
            raise self.fail("an unclosed character class")
        self.at += 1
        return "[" + ("^" if negated else "") + "".join(parts) + "]"

    def repetition(self) -> str:
        if self.at < len(self.text) and self.text[self.at] in "?*+":
            self.at += 1
            self.translator.fixed = False
            return self.text[self.at - 1]
        found = re.match(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}", self.text[self.at :])
        if found is None:
            return ""
        self.at += found.end()
        self.translator.fixed = False
        low, comma, high = found.group(1), found.group(2), found.group(3)
        return "{" + low + ("," + (high or "") if comma else "") + "}"


@cache
def grammar_regex(grammar: str) -> re.Pattern[str]:
    """The regex whose full matches are the texts the grammar's ``root`` admits."""
    return re.compile(_Translator(_rules(grammar)).rule("root"), re.DOTALL)


@cache
def forced_text(grammar: str) -> str | None:
    """The one text a grammar admits, when it leaves no choice (literals only): what any model writes."""
    translator = _Translator(_rules(grammar))
    pattern = translator.rule("root")
    if not translator.fixed:
        return None
    # literals only: every special character is escaped, so the unescaped "(?:" and ")" are the groups
    text, at = [], 0
    while at < len(pattern):
        if pattern.startswith("(?:", at):
            at += 3
            continue
        if pattern[at] == "\\":
            text.append(pattern[at + 1])
            at += 2
            continue
        if pattern[at] != ")":
            text.append(pattern[at])
        at += 1
    return "".join(text)
