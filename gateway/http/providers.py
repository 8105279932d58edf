"""The app's dependency providers: a handler names the parts it uses (``jobs: NamedDependency[JobService]``).

The lifespan (gateway/http/app.py) builds every part once with :func:`open_services` and leaves them in the
app's state; each provider here hands out one of them, per request, and builds nothing. Guards and
before-request hooks, which Litestar gives no dependencies, read the same parts with :func:`services_of`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide

from gateway.http.services import Services

_BUILT: Final = "services"
"""Where in the app's state the lifespan leaves what it built."""

HANDED_OUT: Final = (
    "settings", "keys", "moderation", "jobs", "review", "question_log", "policies", "quotas", "tenants",
    "engines", "admission", "engine_checks", "first_request", "prefix", "metrics", "recent", "engine_cache",
    "console", "oidc", "drain",
)
"""The parts a handler (or a dependency of its) may ask for, each by its name in :class:`Services`. The
engine's own client and telemetry are not among them: the pool speaks for the engines, and telemetry is the
moderation service's."""


def keep_built(app: Litestar, services: Services) -> None:
    """Leave what the lifespan built where the providers find it."""
    app.state[_BUILT] = services


def services_of(app: Litestar) -> Services:
    """What the lifespan built for ``app``: for guards and hooks (they take no dependencies) and tests."""
    services: Services = app.state[_BUILT]
    return services


@dataclass(frozen=True, slots=True)
class _HandOut:
    """The provider of one built part, by its name."""

    name: str

    def __call__(self, state: State) -> Any:
        return getattr(state[_BUILT], self.name)


PROVIDERS: Final = {name: Provide(_HandOut(name), sync_to_thread=False) for name in HANDED_OUT}
"""The app's dependencies: one provider per part (the parts' types: :class:`Services`' fields)."""
