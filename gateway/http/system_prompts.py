"""The system prompt each verdict format is served with, measured on the first engine at start.

Block filling (``MODGATE_SHAPING__PREFIX_STRATEGY=block-fill``) pads the prompt with policy guidance to the
engine's next whole cache block, so every request's shared prefix is cached whole.
"""

from __future__ import annotations

import logging

from gateway.engine.client import EngineClient
from gateway.engine.prefix import PrefixPlanError, block_filled_prompt
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from shaping.prefix import GuidanceTooShort
from shaping.prefix_strategy import PrefixStrategySetting
from shaping.prompt import SystemPrompt, load_system_prompt, prompt_version_for
from shaping.verdict import VerdictFormat

log = logging.getLogger("modgate.gateway")


def prefix_strategy_setting(settings: Settings) -> PrefixStrategySetting:
    """``MODGATE_SHAPING__PREFIX_STRATEGY``; the older ``BLOCK_FILLING_PREFIX=true`` reads as block-fill."""
    shaping = settings.shaping
    if shaping.prefix_strategy == "auto" and shaping.block_filling_prefix:
        return "block-fill"
    return shaping.prefix_strategy


async def system_prompt(
    settings: Settings,
    engine: EngineClient,
    verdict_format: VerdictFormat,
    metrics: GatewayMetrics,
    fill: bool,
) -> SystemPrompt:
    """The canonical prompt; filled with policy guidance to the engine's next whole cache block if asked.

    Measured once at start on the engine's own /tokenize. An engine that cannot be measured leaves the plain
    prompt in force (said loudly): the gateway still serves, the cache just cannot hit.
    """
    version = prompt_version_for(verdict_format)
    metrics.prefix_cacheable(verdict_format, 0)
    if not fill:
        return load_system_prompt(version)
    try:
        prompt, filled = await block_filled_prompt(engine, settings.shaping.prefix_block_size, verdict_format)
    except (PrefixPlanError, GuidanceTooShort) as exc:
        log.error(
            "block-filling prefix OFF (%s verdict): %s; serving the plain system prompt", verdict_format, exc
        )
        return load_system_prompt(version)
    log.warning(
        "block-filling prefix on (%s verdict): +%d tokens of policy guidance; shared prefix %d tokens "
        "(block %d, +%d)",
        verdict_format,
        filled.added_tokens,
        filled.shared_tokens,
        filled.block_size,
        filled.overshoot,
    )
    metrics.prefix_cacheable(verdict_format, filled.shared_tokens // filled.block_size * filled.block_size)
    return prompt
