"""Settings that moved into a group: the old names still read, each with one deprecation warning.

Every setting is ``MODGATE_<GROUP>__<NAME>``. Until issue 41 thirteen of them were flat
(``MODGATE_ENGINE_URL`` beside ``MODGATE_ENGINE__KIND``); ``RENAMED`` maps each old attribute to its group
and field. The old environment name is read after the new one (the new name wins when both are set), and
the old keyword and attribute names keep working in Python (``Settings(engine_url=...)``,
``settings.engine_url``), so code and tests that construct or read settings need not change at once.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

if TYPE_CHECKING:
    # the groups the old names map into: gateway/settings imports this module to read them, so names only here
    from gateway.settings import AuthSettings, EngineSettings, RedisSettings, ServerSettings

PREFIX, NESTED = "MODGATE_", "__"

RENAMED: dict[str, tuple[str, str]] = {
    # old attribute (and MODGATE_<OLD>): (group, field)
    "host": ("server", "host"),
    "port": ("server", "port"),
    "keep_alive_s": ("server", "keep_alive_s"),
    "log_level": ("server", "log_level"),
    "drain_s": ("server", "drain_s"),
    "model_name": ("server", "model_name"),
    "engine_url": ("engine", "url"),
    "engine_caps": ("engine", "caps"),
    "max_inflight": ("engine", "max_inflight"),
    "redis_url": ("redis", "url"),
    "api_keys": ("auth", "api_keys"),
    "api_keys_from_redis": ("auth", "api_keys_from_redis"),
    "admin_token": ("auth", "admin_token"),
}

RENAMED_COMMAND_ENVVARS: dict[str, str] = {
    # an environment name only a command-line tool read: the name every command reads now
    "MODGATE_URL": "MODGATE_GATEWAY_URL",  # `modgate policy`'s; `stats` and `quality run` read the new one
}

log = logging.getLogger(__name__)


def env_name(group: str, field: str) -> str:
    """A setting's one environment name: ``MODGATE_<GROUP>__<NAME>``."""
    return f"{PREFIX}{group.upper()}{NESTED}{field.upper()}"


def deprecated_env_names() -> dict[str, str]:
    """Each old environment name, mapped to the name that replaces it."""
    return {f"{PREFIX}{old.upper()}": env_name(*new) for old, new in RENAMED.items()}


def _say_deprecated(old_name: str, new_name: str, *, superseded: bool) -> None:
    """One deprecation warning for an old name read: a ``DeprecationWarning`` and the same line in the log."""
    winner = f"; {new_name} is set too and wins" if superseded else ""
    message = f"{old_name} is deprecated: use {new_name}{winner} (docs/settings.md)"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    log.warning(message)


def option_envvars(new_name: str) -> list[str]:
    """A command-line option's environment names: the setting's, then the deprecated one it replaced."""
    renamed = {**deprecated_env_names(), **RENAMED_COMMAND_ENVVARS}
    return [new_name, *(old for old, new in renamed.items() if new == new_name)]


def warn_old_option(old_flag: str, new_flag: str) -> None:
    """One deprecation warning for a command-line flag given by its old name (``--url``)."""
    _say_deprecated(old_flag, new_flag, superseded=False)


def warn_if_read_by_old_name(new_name: str) -> Callable[[str | None], str | None]:
    """A command-line option's callback: one deprecation warning when its value came from the old name."""
    old_names = option_envvars(new_name)[1:]

    def check(value: str | None) -> str | None:
        for old_name in old_names:
            if new_name not in os.environ and value is not None and os.environ.get(old_name) == value:
                _say_deprecated(old_name, new_name, superseded=False)
        return value

    return check


def nest_renamed(data: Mapping[str, Any]) -> dict[str, Any]:
    """``{"engine_url": u}`` as ``{"engine": {"url": u}}``, merged into what the group already holds."""
    nested = dict(data)
    for old, (group, field) in RENAMED.items():
        if old not in nested:
            continue
        value = nested.pop(old)
        current = nested.get(group)
        members = dict(current) if isinstance(current, BaseModel | Mapping) else {}
        nested[group] = {**members, field: value}
    return nested


def nest_renamed_update(current: BaseModel, update: Mapping[str, Any]) -> dict[str, Any]:
    """A ``model_copy`` update with each old flat name applied to a copy of its group (no validation)."""
    nested = {name: value for name, value in update.items() if name not in RENAMED}
    for old, value in update.items():
        if old in RENAMED:
            group, field = RENAMED[old]
            members = nested.get(group, getattr(current, group))
            nested[group] = members.model_copy(update={field: value})
    return nested


class RenamedEnvSource(PydanticBaseSettingsSource):
    """The old flat environment names, read below the new ones, each with a deprecation warning."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: ``__call__`` reads the old names itself (they belong to no field)."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        environ = {name.upper(): value for name, value in os.environ.items()}  # names are case-blind
        found: dict[str, dict[str, str]] = {}
        for old, (group, field) in RENAMED.items():
            old_name, new_name = f"{PREFIX}{old.upper()}", env_name(group, field)
            if old_name not in environ:
                continue
            _say_deprecated(old_name, new_name, superseded=new_name in environ)
            found.setdefault(group, {})[field] = environ[old_name]
        return found


class RenamedAttributes:
    """What ``Settings`` keeps of the names before the groups: the old environment names (read below the new
    ones), keywords, methods and read-only attributes."""

    if TYPE_CHECKING:
        server: ServerSettings
        engine: EngineSettings
        redis: RedisSettings
        auth: AuthSettings

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The old flat names right below the new ones: the new name wins where both are set."""
        renamed = RenamedEnvSource(settings_cls)
        return init_settings, env_settings, renamed, dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _old_keywords(cls, data: object) -> object:
        """``Settings(engine_url=...)`` as ``Settings(engine={"url": ...})``: the old keywords still work."""
        return nest_renamed(data) if isinstance(data, Mapping) else data

    def engine_urls(self) -> list[str]:
        """The configured engines, in order (empty: the built-in simulated engine)."""
        return self.engine.urls()

    def engine_cap_map(self) -> dict[str, int]:
        """Caps set in MODGATE_ENGINE__CAPS, by engine URL."""
        return self.engine.cap_map()

    def engine_cap(self, url: str) -> int:
        """An engine's in-flight cap: its MODGATE_ENGINE__CAPS entry, else MODGATE_ENGINE__MAX_INFLIGHT."""
        return self.engine.cap_map().get(url, self.engine.max_inflight)

    @property
    def host(self) -> str:
        """``server.host``."""
        return self.server.host

    @property
    def port(self) -> int:
        """``server.port``."""
        return self.server.port

    @property
    def keep_alive_s(self) -> int:
        """``server.keep_alive_s``."""
        return self.server.keep_alive_s

    @property
    def log_level(self) -> Literal["debug", "info", "warning", "error"]:
        """``server.log_level``."""
        return self.server.log_level

    @property
    def drain_s(self) -> float:
        """``server.drain_s``."""
        return self.server.drain_s

    @property
    def model_name(self) -> str:
        """``server.model_name``."""
        return self.server.model_name

    @property
    def engine_url(self) -> str | None:
        """``engine.url``."""
        return self.engine.url

    @property
    def engine_caps(self) -> str | None:
        """``engine.caps``."""
        return self.engine.caps

    @property
    def max_inflight(self) -> int:
        """``engine.max_inflight``."""
        return self.engine.max_inflight

    @property
    def redis_url(self) -> str | None:
        """``redis.url``."""
        return self.redis.url

    @property
    def api_keys(self) -> str | None:
        """``auth.api_keys``."""
        return self.auth.api_keys

    @property
    def api_keys_from_redis(self) -> bool:
        """``auth.api_keys_from_redis``."""
        return self.auth.api_keys_from_redis

    @property
    def admin_token(self) -> str | None:
        """``auth.admin_token``."""
        return self.auth.admin_token
