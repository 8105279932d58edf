"""The app's dependencies are resolved in the request's own task, in turn (gateway/http/dependencies.py):
Litestar would give each of a level's dependencies a task of its own, for providers that return at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, get
from litestar.di import NamedDependency, Provide
from litestar.testing import TestClient

from gateway.http.app import create_app
from gateway.settings import Settings


def test_a_handlers_dependencies_run_in_its_own_task_in_order() -> None:
    create_app(Settings())  # making the gateway's app puts the resolution in place
    seen: list[tuple[str, asyncio.Task[Any] | None]] = []

    def provider(name: str) -> Any:
        def provide() -> str:
            seen.append((name, asyncio.current_task()))
            return name
        return Provide(provide, sync_to_thread=False)

    async def closing() -> AsyncIterator[str]:
        seen.append(("closing", asyncio.current_task()))
        yield "closing"
        seen.append(("cleaned up", asyncio.current_task()))

    def after(first: NamedDependency[str], second: NamedDependency[str]) -> str:
        seen.append(("after", asyncio.current_task()))
        return f"{first}+{second}"

    @get("/", dependencies={
        "first": provider("first"), "second": provider("second"), "third": provider("third"),
        "closing": Provide(closing), "after": Provide(after, sync_to_thread=False),
    })
    async def handler(
        first: NamedDependency[str], second: NamedDependency[str], third: NamedDependency[str],
        closing: NamedDependency[str], after: NamedDependency[str],
    ) -> dict[str, Any]:
        seen.append(("handler", asyncio.current_task()))
        return {"values": [first, second, third, closing, after]}

    with TestClient(Litestar([handler])) as client:
        response = client.get("/")
    assert response.json() == {"values": ["first", "second", "third", "closing", "first+second"]}
    names = [name for name, _ in seen]
    assert names.index("after") > max(names.index("first"), names.index("second"))  # levels in order
    assert names[-1] == "cleaned up"
    handler_task = dict(seen)["handler"]
    assert {task for _, task in seen} == {handler_task}, "a dependency ran in a task of its own"
