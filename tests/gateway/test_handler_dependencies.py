"""Each handler names the parts it uses: none takes the whole of what the lifespan built (``Services``), none
reaches it through the app's state, and each part a handler names is declared with the part's own type."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from litestar import Litestar, Request, get
from litestar.di import NamedDependency, Provide

from gateway.http.app import create_app
from gateway.http.providers import HANDED_OUT, PROVIDERS, services_of
from gateway.http.services import Services
from gateway.jobs.service import JobService
from gateway.review.service import ReviewQueue
from gateway.settings import Settings

PART_TYPES = typing.get_type_hints(Services)
"""Each part's type, by its name."""


def consumers(app: Litestar) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every route handler of ``app``, and every provider its dependencies go through but the parts' own
    (Litestar's own handlers, for OPTIONS and the OpenAPI document, take none of the parts)."""
    table = {id(provider) for provider in PROVIDERS.values()}
    seen: set[int] = set()
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            found = [(handler.handler_name, handler.fn)] + [
                (f"dependency {name!r}", provider.dependency)
                for name, provider in handler.resolve_dependencies().items() if id(provider) not in table
            ]
            for name, target in found:
                if target.__module__.partition(".")[0] != "litestar" and id(target) not in seen:
                    seen.add(id(target))
                    yield name, target


def parameters(target: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' types (a class dependency's: its fields'), their ``NamedDependency`` taken off."""
    hints = typing.get_type_hints(target if inspect.isclass(target) else inspect.unwrap(target))
    hints.pop("return", None)
    return hints


def bag_takers(app: Litestar) -> list[str]:
    """The handlers and providers of ``app`` that take the whole bag, or reach it through the app's state."""
    takers = []
    for name, target in consumers(app):
        if any(Services in {hint, *typing.get_args(hint)} for hint in parameters(target).values()):
            takers.append(f"{name} takes Services")
        elif not inspect.isclass(target) and "services_of(" in inspect.getsource(target):
            takers.append(f"{name} reads Services from the app's state")
    return takers


def mistyped(app: Litestar) -> list[str]:
    """Parts asked for under a type other than their own (the provider hands out by name)."""
    return [
        f"{name}: {part} is a {PART_TYPES[part]}, not a {hint}"
        for name, target in consumers(app)
        for part, hint in parameters(target).items()
        if part in HANDED_OUT and hint != PART_TYPES[part]
    ]


def gateway_app() -> Litestar:
    return create_app(Settings(), httpx.MockTransport(lambda _: httpx.Response(500)))


def test_no_handler_takes_the_whole_bag_and_each_part_has_its_own_type() -> None:
    app = gateway_app()
    names = {name for name, _ in consumers(app)}
    # the scan reaches the business, admin, review, console and operations routes, and the console's providers
    assert {"create_moderation", "create_job", "put_thinking_policy", "label_review_item", "readyz",
            "console_page", "review_decide", "oidc_callback"} <= names
    assert {"dependency 'caller'", "dependency 'visitor'", "dependency 'dashboard'"} <= names
    assert bag_takers(app) == []
    assert mistyped(app) == []


def test_every_part_handed_out_is_one_the_lifespan_builds_and_litestar_can_check() -> None:
    assert set(HANDED_OUT) <= set(PART_TYPES)
    assert set(PROVIDERS) == set(HANDED_OUT)
    # Litestar checks each dependency against its declared type by isinstance (a protocol must be
    # runtime-checkable, else the request fails with a 500)
    for part in HANDED_OUT:
        for kind in typing.get_args(PART_TYPES[part]) or (PART_TYPES[part],):
            assert not isinstance(object(), kind), part


def test_a_planted_handler_taking_the_bag_is_caught() -> None:
    @get("/planted")
    async def planted(services: NamedDependency[Services]) -> None:
        """Reaches everything."""

    def everything(request: Request[Any, Any, Any]) -> Services:
        return services_of(request.app)

    whole = Provide(everything, sync_to_thread=False)
    app = Litestar([planted], dependencies={**PROVIDERS, "services": whole})
    assert bag_takers(app) == [
        "planted takes Services", "dependency 'services' reads Services from the app's state"
    ]


def test_a_planted_handler_reading_the_bag_from_the_state_is_caught() -> None:
    @get("/planted")
    async def planted(request: Request[Any, Any, Any]) -> None:
        """Reaches everything through the app."""
        await services_of(request.app).jobs.stop()

    assert bag_takers(Litestar([planted], dependencies=PROVIDERS)) == [
        "planted reads Services from the app's state"
    ]


def test_a_part_asked_for_under_another_type_is_caught() -> None:
    @get("/planted")
    async def planted(jobs: NamedDependency[ReviewQueue], review: NamedDependency[ReviewQueue]) -> None:
        """Names the job service's dependency as the review queue."""

    assert mistyped(Litestar([planted], dependencies=PROVIDERS)) == [
        f"planted: jobs is a {JobService}, not a {ReviewQueue}"
    ]
