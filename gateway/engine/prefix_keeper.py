"""Each engine's prefix strategy, chosen at start and again after a restart, and the priming it needs.

The choice is :func:`shaping.prefix_strategy.choose_prefix_strategy` over what the engine shows: its kind,
``vllm:cache_config_info`` and the shared prefix in its own tokens; made per engine at start, and again for an
engine that comes back after a restart or shows another cache config (:meth:`PrefixKeeper.watch`). On an
engine with a match unit the keeper sends one priming request (``POST /v1/completions`` with the shared
prefix's token ids and one more) so the engine keeps the linear-attention state at the shared prefix; then it
watches the cached tokens of every answer and primes again when a request sent after the last priming took
fewer than the shared prefix from the cache (a restart, a model swap, an eviction), reading the engine's cache
config again first.

Priming runs beside the traffic, never in a request's way: a failed priming is logged and counted, and the
requests go on uncached until the next one succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.engine.client import EngineClient
from gateway.engine.engine_slot import EngineHold, unheld
from gateway.engine.prefix import EngineTokens, PrefixPlanError
from gateway.engine.wires import read_cache_config
from gateway.errors import ModgateError
from gateway.series.metrics import GatewayMetrics
from gateway.tasks import stop
from shaping.prefix import shared_prefix_length
from shaping.prefix_strategy import (
    EngineCacheConfig,
    PrefixDecision,
    PrefixStrategySetting,
    choose_prefix_strategy,
    primed_cached_tokens,
    priming_prompt,
)
from shaping.prompt import SystemPrompt
from shaping.verdict import VerdictFormat

log = logging.getLogger("modgate.prefix")

ENGINE_CHECKPOINT_GRACE = 3
"""Short answers tolerated before priming an engine that checkpoints the shared prefix itself."""

ACTIONS = ("prime", "engine-checkpoint", "fill", "none", "uncacheable")


@dataclass
class EnginePrefixState:
    """What the keeper knows of one engine."""

    url: str
    decision: PrefixDecision | None = None
    model: str | None = None
    shared_ids: dict[VerdictFormat, list[int]] = field(default_factory=dict)
    expected: dict[VerdictFormat, int] = field(default_factory=dict)  # cached tokens a request should get
    primings: int = 0
    primed_at: float | None = None  # monotonic time the last priming finished (None: not primed)
    reread_at: float | None = None  # monotonic time an unread engine was last asked again
    last_error: str | None = None
    unread: bool = False  # the engine could not be read when last asked: ask again on its next answer
    seen: tuple[str, EngineCacheConfig | None] | None = None  # its kind and cache config when decided
    down: bool = False  # the watch could not reach it: decided again when it answers (a restart)
    shortfalls: int = 0  # answers since the last priming that took fewer cached tokens than expected
    task: asyncio.Task[None] | None = None

    def document(self) -> dict[str, Any]:
        """The engine's part of ``/readyz``."""
        decision = self.decision
        return {
            "strategy": None if decision is None else decision.action,
            "reason": None if decision is None else decision.reason,
            "fix": None if decision is None else decision.fix,
            "expected_cached_tokens": dict(self.expected),
            "primed": self.primed_at is not None,
            "primings": self.primings,
            "last_error": self.last_error,
        }


class PrefixKeeper:
    """Chooses, primes and re-primes each engine's prefix cache (``MODGATE_SHAPING__PREFIX_STRATEGY``)."""

    def __init__(
        self,
        setting: PrefixStrategySetting,
        clients: Sequence[EngineClient],
        metrics: GatewayMetrics,
        *,
        fill_max_tokens: int,
        reprime_interval_s: float,
        block_size: int | None = None,
        hold: EngineHold = unheld,
        passed_first_request: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.setting = setting
        self.hold = hold  # the engine's slot for a priming: within its in-flight cap, as a keyframe
        # Primed only once it passed the first-request probe: a hybrid engine in float32 dies on its first
        # request, and the probe's is the one that says why (gateway/engine/first_request.py).
        self.passed_first_request = passed_first_request
        self.block_size = block_size
        self.fill_max_tokens = fill_max_tokens
        self.reprime_interval_s = reprime_interval_s
        # every request through the engine's own client: counted, timed, under its circuit and timeouts
        self.clients = {client.base_url: client for client in clients}
        self.engines = {client.base_url: EnginePrefixState(client.base_url) for client in clients}
        self._watch: asyncio.Task[None] | None = None
        self.system_prompts: Mapping[VerdictFormat, SystemPrompt] = {}
        self.metrics = metrics

    # --- choosing ---------------------------------------------------------------------------------------

    async def decide(
        self, url: str, system_prompts: Mapping[VerdictFormat, SystemPrompt], *, reason: str = "start"
    ) -> PrefixDecision:
        """Read the engine and choose its strategy; on an engine that cannot be read, nothing changes."""
        state = self.engines[url]
        http = self.clients[url]
        try:
            kind, config = await self._read(http)
            state.seen = (kind, config)
            prefix_reuse = (await http.wire()).prefix_reuse
            if prefix_reuse is not None:
                decision = choose_prefix_strategy(self.setting, prefix_reuse, None, 0, self.fill_max_tokens)
                state.unread, state.expected = False, {}
                self._set(state, decision, reason)
                return decision
            engine = await EngineTokens.connect(http)
            state.model = engine.model
            shared: dict[VerdictFormat, list[int]] = {}
            for verdict_format, prompt in system_prompts.items():
                shared[verdict_format] = await _shared_ids(engine, prompt.text)
        except (PrefixPlanError, ModgateError, ValueError) as exc:  # ValueError: /metrics unparsable
            state.last_error, state.unread = f"{exc}", True
            decision = PrefixDecision("none", f"the engine could not be read ({exc}): nothing is changed")
            self._set(state, decision, reason)
            return decision
        state.unread, state.last_error = False, None
        state.shared_ids = shared
        shortest = min((len(ids) for ids in shared.values()), default=0)
        decision = choose_prefix_strategy(self.setting, None, config, shortest, self.fill_max_tokens)
        unit = None if config is None else config.match_unit
        state.expected = {
            verdict_format: primed_cached_tokens(len(ids), unit) if decision.primes and unit else 0
            for verdict_format, ids in shared.items()
        }
        self._set(state, decision, reason)
        return decision

    async def _read(self, http: EngineClient) -> tuple[str, EngineCacheConfig | None]:
        """The engine's kind (its wire, as its client detects it) and cache config (``/metrics``): what the
        strategy follows. Raises ``ModgateError`` where the engine cannot be reached."""
        wire = await http.wire()
        response = await http.request("GET", "/metrics", purpose="metrics")
        if wire.prefix_reuse is not None:
            return wire.kind, None  # no block to plan for: its cache config does not matter
        config = read_cache_config(response.text) if response.status_code == 200 else None
        if self.block_size is not None:  # MODGATE_SHAPING__PREFIX_BLOCK_SIZE: the operator's word
            config = replace(config or EngineCacheConfig(), block_size=self.block_size)
        return wire.kind, config

    def _set(self, state: EnginePrefixState, decision: PrefixDecision, reason: str) -> None:
        changed = state.decision != decision
        state.decision = decision
        self.metrics.prefix_strategy_chosen(state.url, decision.action, ACTIONS)
        if not changed:
            return
        if decision.action == "uncacheable":
            log.error("prefix cache (%s) on %s: %s; fix: %s", reason, state.url, decision.reason,
                      decision.fix)
        else:  # a strategy that works, chosen at start, is news; a change later or an unread engine is not
            level = logging.INFO if reason == "start" and not state.unread else logging.WARNING
            log.log(level, "prefix cache (%s) on %s: %s: %s", reason, state.url, decision.action,
                    decision.reason)

    async def start(self, system_prompts: Mapping[VerdictFormat, SystemPrompt]) -> None:
        """Choose every engine's strategy (kept where already chosen) and prime where it is needed."""
        self.system_prompts = system_prompts
        for state in self.engines.values():
            if state.decision is None or not state.shared_ids:
                await self.decide(state.url, system_prompts)
            if state.decision is not None and state.decision.action == "prime":
                await self.prime(state.url, "start")

    # --- priming ----------------------------------------------------------------------------------------

    async def prime(self, url: str, reason: str) -> bool:
        """Send the priming request of every system prompt; answers whether all of them were taken."""
        state = self.engines[url]
        if self.passed_first_request is not None and not await self.passed_first_request(url):
            state.last_error = "not primed: the engine has not passed its first request (see /readyz engines)"
            return False
        http = self.clients[url]
        try:
            async with self.hold(url):
                for ids in state.shared_ids.values():
                    body = {"model": state.model, "prompt": priming_prompt(ids), "max_tokens": 1}
                    response = await http.request("POST", "/v1/completions", purpose="primer", json=body)
                    if response.status_code != 200:
                        raise PrefixPlanError(
                            f"/v1/completions answered {response.status_code}: {response.text[:200]}"
                        )
        except (PrefixPlanError, ModgateError, ValueError) as exc:  # Modgate: no slot, engine unreachable
            state.last_error = f"priming failed: {exc!r}"
            self.metrics.prefix_primed(url, "failed")
            log.warning("prefix cache: priming %s failed (%s): requests go on uncached", url, exc)
            return False
        state.primings += 1
        state.shortfalls = 0
        state.primed_at = time.monotonic()
        state.last_error = None
        self.metrics.prefix_primed(url, reason)
        log.info("prefix cache: primed %s (%s)", url, reason)
        return True

    def observe(self, url: str, verdict_format: VerdictFormat, prompt_tokens: int, cached_tokens: int,
                sent_at: float) -> None:
        """One answer's cached tokens: prime again when a request sent after the last priming fell short."""
        state = self.engines.get(url)
        if state is None or (state.task is not None and not state.task.done()):
            return  # not an engine of the pool, or a priming is on its way
        now = time.monotonic()
        if state.unread and now - (state.reread_at or 0.0) >= self.reprime_interval_s:
            state.reread_at = now  # the engine answers again: read it (at most once an interval)
            state.task = asyncio.create_task(self._reprime(url), name=f"prefix-reread-{url}")
            return
        if state.decision is None or not state.decision.primes:
            return
        expected = state.expected.get(verdict_format, 0)
        if not expected or cached_tokens >= expected or prompt_tokens <= expected:
            return
        primed_at = state.primed_at
        if primed_at is not None and (sent_at < primed_at or now - primed_at < self.reprime_interval_s):
            return  # sent before the state was kept, or primed a moment ago
        state.shortfalls += 1
        # The engine's own junction checkpoint needs a sibling request to see the junction: give it a few.
        if state.decision.action == "engine-checkpoint" and state.shortfalls < ENGINE_CHECKPOINT_GRACE:
            return
        state.task = asyncio.create_task(self._reprime(url), name=f"prefix-reprime-{url}")

    async def _reprime(self, url: str, reason: str = "cache_fell") -> None:
        """The engine lost the state (or was restarted or swapped): read it again, then prime if it still
        wants it."""
        decision = await self.decide(url, self.system_prompts, reason=reason)
        if decision.primes:
            await self.prime(url, reason)

    def start_watching(self, interval_s: float) -> None:
        """Watch the engines in the background (:meth:`watch`) until :meth:`stop`."""
        if self._watch is None:
            self._watch = asyncio.create_task(self.watch(interval_s), name="prefix-watch")

    async def watch(self, interval_s: float) -> None:
        """Read every engine's kind and cache config each ``interval_s`` (no slot: ``/props``, ``/metrics``)
        and decide again for one that came back after it could not be reached (``restart``) or shows
        another config (``swap``: other flags or another model), priming it if the new decision primes.

        Cached tokens falling short notice a lost state only on an engine that primes; this notices an
        engine whose strategy should change (one restarted with ``--prefix-match-unit``, or without it)."""
        while True:
            await asyncio.sleep(interval_s)
            for state in self.engines.values():
                if state.decision is None or (state.task is not None and not state.task.done()):
                    continue
                try:
                    seen = await self._read(self.clients[state.url])
                except (ModgateError, ValueError):  # ValueError: /metrics unparsable
                    state.down = True
                    continue
                if state.down or seen != state.seen:
                    reason = "restart" if state.down else "swap"
                    state.down = False
                    state.task = asyncio.create_task(self._reprime(state.url, reason),
                                                     name=f"prefix-{reason}-{state.url}")

    async def stop(self) -> None:
        """Stop watching; cancel primings on their way."""
        await stop(self._watch, *(state.task for state in self.engines.values()))

    def status(self) -> dict[str, dict[str, Any]]:
        """Every engine's strategy, by URL (``/readyz``)."""
        return {url: state.document() for url, state in self.engines.items()}


async def _shared_ids(engine: EngineTokens, system_text: str) -> list[int]:
    """The shared prefix's token ids: the system prompt and the template up to the user's content."""
    first, second = await asyncio.gather(*(
        engine.token_ids([{"role": "system", "content": system_text}, {"role": "user", "content": text}])
        for text in ("A", "B")
    ))
    return first[: shared_prefix_length(first, second)]
