"""Rules on every service's command line as its program's parser reads it."""

from __future__ import annotations

from collections.abc import Iterator

from deploy.check.compose import Deployment
from deploy.check.model import Finding, Flag, where

# Flags whose repetition accumulates instead of overriding (vLLM's --middleware, Redis' --save ...).
_REPEATABLE_FLAGS = frozenset({"--middleware", "--save", "--loadmodule", "--include", "--rename-command"})


def duplicate_flags(deployment: Deployment) -> Iterator[Finding]:
    """duplicate-flag: a flag given twice in one service's entrypoint + command (the later one wins)."""
    for service in deployment.services.values():
        first: dict[str, Flag] = {}
        for flag in service.flags:
            if flag.key in _REPEATABLE_FLAGS:
                continue
            earlier = first.get(flag.key)
            first[flag.key] = flag
            if earlier is None:
                continue
            yield Finding(
                "error",
                "duplicate-flag",
                f"`{flag.name}` {_shown(flag)} silently wins over `{earlier.name}` {_shown(earlier)} given "
                f"earlier at {where(earlier.arg.location, flag.arg.location)}: give each flag once",
                flag.arg.location,
                (earlier.arg.location,),
            )


def _shown(flag: Flag) -> str:
    return f"{flag.value!r}" if flag.value is not None else "(a switch)"
