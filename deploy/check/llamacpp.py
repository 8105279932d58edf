"""llama-server's settings as its parser reads them: short and long names, `LLAMA_ARG_*` variables, defaults.

A flag on the command line wins over its environment variable (common/arg.cpp). Defaults are the server's
own (common/common.h; `--parallel` is -1, auto, in the server: 4 slots sharing one unified KV cache).
`deploy check`'s llama.cpp rules and `deploy predict` read a llama.cpp service through `server_settings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deploy.check.model import Location

# Every other spelling of a setting, to its long name (and whether that spelling turns a switch off).
_ALIASES: dict[str, tuple[str, bool]] = {
    "-m": ("--model", False),
    "-mm": ("--mmproj", False),
    "-a": ("--alias", False),
    "-c": ("--ctx-size", False),
    "-np": ("--parallel", False),
    "-ngl": ("--gpu-layers", False),
    "--n-gpu-layers": ("--gpu-layers", False),
    "-b": ("--batch-size", False),
    "-ub": ("--ubatch-size", False),
    "-ctxcp": ("--ctx-checkpoints", False),
    "--swa-checkpoints": ("--ctx-checkpoints", False),
    "-cms": ("--checkpoint-min-step", False),
    "-cram": ("--cache-ram", False),
    "-kvu": ("--kv-unified", False),
    "-no-kvu": ("--kv-unified", True),
    "-sps": ("--slot-prompt-similarity", False),
    "-cb": ("--cont-batching", False),
    "-nocb": ("--cont-batching", True),
    "-fa": ("--flash-attn", False),
}
# The LLAMA_ARG_* variable of each long name the checks read.
ENVIRONMENT = {
    "--model": "LLAMA_ARG_MODEL",
    "--mmproj": "LLAMA_ARG_MMPROJ",
    "--ctx-size": "LLAMA_ARG_CTX_SIZE",
    "--parallel": "LLAMA_ARG_N_PARALLEL",
    "--gpu-layers": "LLAMA_ARG_N_GPU_LAYERS",
    "--batch-size": "LLAMA_ARG_BATCH",
    "--ubatch-size": "LLAMA_ARG_UBATCH",
    "--ctx-checkpoints": "LLAMA_ARG_CTX_CHECKPOINTS",
    "--cache-ram": "LLAMA_ARG_CACHE_RAM",
    "--kv-unified": "LLAMA_ARG_KV_UNIFIED",
    "--cache-prompt": "LLAMA_ARG_CACHE_PROMPT",
    "--cache-reuse": "LLAMA_ARG_CACHE_REUSE",
    "--metrics": "LLAMA_ARG_ENDPOINT_METRICS",
    "--jinja": "LLAMA_ARG_JINJA",
    "--slot-prompt-similarity": "LLAMA_ARG_SLOT_PROMPT_SIMILARITY",
}
SWITCHES = frozenset({"--kv-unified", "--cache-prompt", "--metrics", "--jinja", "--cont-batching"})
AUTO_SLOTS = 4  # --parallel -1 (the server's default): 4 slots, unified KV (tools/server/server.cpp)


@dataclass(frozen=True)
class ServerSetting:
    """One setting of llama-server: its long name, value (a switch: "true"/"false") and where it was set."""

    key: str
    value: str | None
    location: Location | None
    from_environment: bool = False

    @property
    def on(self) -> bool:
        """A switch's state (a value-taking setting: whether it is given at all)."""
        return (self.value or "").lower() not in ("false", "0", "off", "no")


def canonical(key: str, negated: bool) -> tuple[str, bool]:
    """The long name of a flag as matched (`--x` for `--no-x`) and whether it turns a switch off."""
    name, off = _ALIASES.get(key, (key, False))
    return name, negated or off


def server_settings(
    flags: Iterable[tuple[str, str | None, bool, Location | None]],
    environment: Mapping[str, str | None],
) -> dict[str, ServerSetting]:
    """Settings by long name from (key, value, negated, location) flags, over the LLAMA_ARG_* variables."""
    settings: dict[str, ServerSetting] = {}
    for key, variable in ENVIRONMENT.items():
        value = environment.get(variable)
        if value is not None:
            settings[key] = ServerSetting(key, value, None, from_environment=True)
    for raw_key, value, negated, location in flags:
        key, off = canonical(raw_key, negated)
        if key in SWITCHES:
            value = "false" if off else "true"
        settings[key] = ServerSetting(key, value, location)
    return settings


def slots(settings: Mapping[str, ServerSetting]) -> tuple[int, bool]:
    """(slots, unified KV): `--parallel` as given, or the server's auto (4 slots, unified)."""
    given = settings.get("--parallel")
    text = given.value or "" if given is not None else ""
    count = int(text) if text.lstrip("-").isdigit() else -1
    unified = settings["--kv-unified"].on if "--kv-unified" in settings else False
    if count < 0:
        return AUTO_SLOTS, True
    return count, unified
