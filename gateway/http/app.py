"""The gateway's Litestar app: ``create_app(settings)``, an explicit route list, lifespan-managed clients.

Who may call what is declared here, once per group of routes: business routes behind the API-key guard,
admin routes behind the admin-token guard (gateway/http/guards.py), the console with its own dependencies
on who is asking, and the operations routes (health, metrics, stats) open. Each handler names the parts it
uses (``jobs: NamedDependency[JobService]``), handed out from what the lifespan built once
(gateway/http/providers.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from litestar import Litestar, Response, Router
from litestar.openapi import OpenAPIConfig
from litestar.plugins.pydantic import PydanticDIPlugin, PydanticSchemaPlugin

from gateway.drain import Drain
from gateway.http.auth import KeyRing
from gateway.http.console import oidc_routes, review_page
from gateway.http.console import routes as console
from gateway.http.dependencies import install as resolve_dependencies_in_turn
from gateway.http.error_handlers import EXCEPTION_HANDLERS
from gateway.http.guards import ACTOR, CALLER, admin_token, business_key
from gateway.http.json_body import JsonTypesPlugin
from gateway.http.openapi import exact_openapi
from gateway.http.providers import PROVIDERS, keep_built
from gateway.http.routes import admin, decisions, jobs, moderations, ops, review, videos
from gateway.http.services import open_services
from gateway.settings import Settings

log = logging.getLogger("modgate.gateway")


def create_app(
    settings: Settings | None = None,
    engine_transport: httpx.AsyncBaseTransport | None = None,
    drain: Drain | None = None,
) -> Litestar:
    """The gateway app; settings are passed in (tests) or read from ``MODGATE_*``.

    ``engine_transport`` replaces the network under the engine client (tests use ``httpx.MockTransport``).
    ``drain``: the process's, which its server begins on SIGTERM (cli/serving.py).
    """
    settings = settings or Settings()
    drain = drain or Drain(settings.server.drain_s)
    resolve_dependencies_in_turn()  # no task per dependency: each hands out a part already built
    auth = settings.auth
    keys = KeyRing(settings.tenant_keys(), auth.admin_token, keys_in_store=auth.api_keys_from_redis)
    if keys.open:
        log.warning(
            "MODGATE_AUTH__API_KEYS is unset: business calls need NO API key. Set it before exposing the "
            "gateway."
        )

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with open_services(settings, keys, engine_transport, drain=drain) as services:
            keep_built(app, services)
            yield

    async def close_while_draining(response: Response[object]) -> Response[object]:
        # Keep-alive callers come back through the load balancer, to a replica that stays.
        if drain.active:
            response.headers["connection"] = "close"
        return response

    app = Litestar(
        route_handlers=[
            Router(
                "/",
                route_handlers=[*moderations.ROUTES, *decisions.ROUTES, *videos.ROUTES, *jobs.ROUTES],
                guards=[business_key],
                dependencies=CALLER,
            ),
            *ops.ROUTES,
            Router("/", route_handlers=admin.ROUTES, guards=[admin_token], dependencies=ACTOR),
            Router("/", route_handlers=review.ROUTES, guards=[review.review_access],
                   dependencies=review.REVIEWER),
            Router("/", route_handlers=[*console.ROUTES, *review_page.ROUTES, *oidc_routes.ROUTES],
                   dependencies=console.OPERATOR),
        ],
        dependencies=PROVIDERS,  # each part the lifespan built, by name: a handler takes the ones it uses
        lifespan=[lifespan],
        after_request=close_while_draining,
        exception_handlers=EXCEPTION_HANDLERS,
        # bodies in JSON's own types, as the OpenAPI document reads them (gateway/http/json_body.py)
        plugins=[JsonTypesPlugin(), PydanticSchemaPlugin(), PydanticDIPlugin()],
        request_max_body_size=settings.shaping.max_body_bytes,
        openapi_config=OpenAPIConfig(title="modgate", version="0.1.0", path="/schema"),
        logging_config=None,  # the process owns logging; an app must not reconfigure the root logger
        debug=False,
    )
    exact_openapi(app, settings)
    return app
