"""Litestar's dependencies resolved one after another, in the request's own task.

Litestar resolves the dependencies of one level of its dependency graph concurrently: two or more (a
moderation names four: settings, quotas, the moderation service, the caller) are each run in a task of their
own in an anyio task group, though every provider here hands out a part the lifespan already built and
returns at once (gateway/http/providers.py). The task group and its tasks were a twentieth of the event
loop's time per moderation (bench/overhead.py under cProfile), and a provider's result is no sooner for it.
Upstream: litestar-org/litestar#4563 (open).

:func:`resolve_in_turn` is Litestar's own ``KwargsModel.resolve_dependencies`` with the levels' dependencies
awaited in turn (as FastAPI does); the order of the levels, each dependency's resolution and its clean-up are
Litestar's. :func:`install` puts it in place, once, when the app is made.
"""

from __future__ import annotations

from typing import Any

from litestar._kwargs.cleanup import DependencyCleanupGroup
from litestar._kwargs.dependencies import resolve_dependency
from litestar._kwargs.kwargs_model import KwargsModel
from litestar.connection import ASGIConnection


async def resolve_in_turn(
    self: KwargsModel, connection: ASGIConnection[Any, Any, Any, Any], kwargs: dict[str, Any]
) -> DependencyCleanupGroup:
    """Every dependency into ``kwargs``, level by level, each awaited in the request's task."""
    cleanup_group = DependencyCleanupGroup()
    for batch in self.dependency_batches:
        for dependency in batch:
            await resolve_dependency(dependency, connection, kwargs, cleanup_group)
    return cleanup_group


def install() -> None:
    """Have Litestar resolve dependencies with :func:`resolve_in_turn` (idempotent)."""
    KwargsModel.resolve_dependencies = resolve_in_turn  # type: ignore[method-assign]  # the patch itself
