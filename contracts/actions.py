"""The three actions a verdict can take: one vocabulary for records, the shaping library and the service."""

from __future__ import annotations

from typing import Literal

Action = Literal["allow", "review", "block"]
ACTIONS: tuple[Action, ...] = ("allow", "review", "block")
