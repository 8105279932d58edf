"""Every `deploy check` rule, registered once in `RULES`; each takes the read deployment, yields findings.

One module per family: `source` (the YAML as written), `command_line` (every service's flags), `engine`
(what the engine needs to start and report), `tuning` (departures from the measured Spark tuning),
`gateway` (what a gateway and its engine must agree on), `llamacpp` (llama.cpp's server's own pitfalls).
The rule ids and what each checks are listed in the `deploy.check` package docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from deploy.check.compose import Deployment
from deploy.check.model import Finding
from deploy.check.rules import command_line, engine, gateway, llamacpp, prefix, source, tuning

Rule = Callable[[Deployment], Iterator[Finding]]

RULES: tuple[Rule, ...] = (
    source.duplicate_keys,
    source.interpolation,
    source.unquoted_numbers,
    command_line.duplicate_flags,
    engine.memory_fraction,
    tuning.speculative_decoding,
    tuning.prefill_scheduling,
    tuning.prefill_balancing,
    gateway.scheduling_policy,
    engine.prompt_tokens_details,
    engine.mamba_block_size,
    prefix.prefix_match_unit,
    gateway.max_inflight,
    gateway.queue_backstop,
    llamacpp.slot_context,
    llamacpp.slots_vs_cap,
    llamacpp.prompt_cache,
    llamacpp.gpu_layers,
    llamacpp.endpoints,
)


def run_rules(deployment: Deployment) -> list[Finding]:
    """Every rule's findings, in `RULES` order (the report sorts them by place)."""
    return [finding for rule in RULES for finding in rule(deployment)]
