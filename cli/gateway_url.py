"""The gateway a command talks to: ``--gateway-url`` / ``MODGATE_GATEWAY_URL`` in every command.

``MODGATE_URL`` (what `modgate policy` read) is still read after the new name, and ``--url`` still works
where a command had it, each with a deprecation warning (gateway/renamed_settings.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from gateway.renamed_settings import option_envvars, warn_if_read_by_old_name, warn_old_option

GATEWAY_URL = "MODGATE_GATEWAY_URL"
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"

GatewayUrl = Annotated[str, typer.Option(
    "--gateway-url", envvar=option_envvars(GATEWAY_URL), callback=warn_if_read_by_old_name(GATEWAY_URL),
    help="The gateway's base URL.",
)]
OldUrl = Annotated[str | None, typer.Option(
    "--url", hidden=True, show_default=False, help="Deprecated: use --gateway-url.",
)]


def gateway_url(given: str, old: str | None) -> str:
    """The gateway URL: ``--url``'s when the deprecated flag was given (with a warning), else ``given``."""
    if old is None:
        return given
    warn_old_option("--url", "--gateway-url")
    return old
