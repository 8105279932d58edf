"""The first-request probe: one tiny real request to each engine before it is called ready.

An engine can boot, answer ``/health`` 200 and still fail every request. The case seen on the real vLLM
CPU build: a hybrid (linear-attention) model served in float32 answers its first chat request 500
("EngineCore encountered an issue"; its log says "CPU GDN attention requires BF16.") and then exits.
The gateway sends this probe at start, before any other request of its own (the start-up check's probes,
the prefix primer: the first request the engine gets is the one that finds this out, and the engine exits
after it), and ``/readyz`` sends it to each vLLM engine that answers ``/health`` and was not probed since it
came up, when it reports a linear-attention (mamba) cache in ``vllm:cache_config_info`` (again after the
engine was seen down: a restart may change its flags). So that failure is reported at start, with what to
change, in ``/readyz`` and the log, not by the first keyframe's 500; and it stays in ``/readyz`` while the
engine is down, since it says why. The fix (bfloat16) is named only when the engine says its weights are
float32: vLLM says its dtype at ``/server_info`` (served with ``VLLM_SERVER_DEV_MODE=1``); where it does not,
the message says the dtype could not be read, and the engine's log has the cause. Other engines are not
sent it: no other start-up fault of this kind is known, and an extra request at every start would be counted
by whoever watches the engine's request counters. The probe takes a slot of the engine's in-flight cap
(``hold``), as a keyframe does.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gateway.engine.answers import ENGINE_REJECTED
from gateway.engine.client import EngineClient
from gateway.engine.engine_slot import EngineHold, unheld
from gateway.engine.pool import EnginePool
from gateway.engine.wires import read_cache_config
from gateway.errors import ModgateError, UpstreamError

log = logging.getLogger("modgate.engine")

PROBE_REQUEST_ID: Final = "modgate-first-request"
HYBRID_ON_CPU_NEEDS_BF16: Final = (
    "a hybrid (linear-attention) model on the CPU needs bfloat16: start vLLM with --dtype bfloat16 "
    "(its CPU Gated DeltaNet kernel refuses float32)"
)
_NOT_HYBRID: Final = {"", "none"}  # vllm:cache_config_info's mamba_cache_mode on a model with no mamba layers


def probe_body(model: str) -> dict[str, Any]:
    """The smallest real chat request: one user word, one token back, thinking off."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "ok"}],
        "max_tokens": 1,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def serves_linear_attention(metrics_text: str) -> bool | None:
    """Whether the engine's cache configuration shows a mamba (linear-attention) cache; None: not said
    (nor when the text is not Prometheus' format: an engine's unreadable metrics must not stop a start)."""
    config = read_cache_config(metrics_text)
    mode = None if config is None else config.mamba_cache_mode
    return None if mode is None else mode.strip().lower() not in _NOT_HYBRID


def served_dtype(server_info: dict[str, Any] | None) -> str | None:
    """The weights' dtype in vLLM's ``/server_info`` (``float32``, ``bfloat16`` …): its JSON form's
    ``vllm_config.model_config.dtype`` (``torch.float32``) or its text form's ``dtype=torch.float32``."""
    config = None if server_info is None else server_info.get("vllm_config")
    if isinstance(config, dict):
        model_config = config.get("model_config")
        said = model_config.get("dtype") if isinstance(model_config, dict) else None
    else:
        found = re.search(r"\bdtype=([\w.]+)", config) if isinstance(config, str) else None
        said = found.group(1) if found else None
    return str(said).removeprefix("torch.") if said else None


def failure_message(error: str, dtype: str | None) -> str:
    """What ``/readyz`` and the log say of a hybrid engine whose first request failed: the fix where the
    engine's dtype is float32, else what it serves and where the cause is."""
    failed = f"the engine failed its first request ({error})"
    if dtype == "float32":
        return f"{failed}: {HYBRID_ON_CPU_NEEDS_BF16}"
    if dtype is not None:
        return f"{failed}: it serves {dtype} weights; the engine's log says why"
    return (f"{failed}: the engine's log says why (its dtype could not be read: vLLM says it at /server_info "
            "when started with VLLM_SERVER_DEV_MODE=1)")


@dataclass(frozen=True, slots=True)
class FirstRequest:
    """One engine's probe outcome: ``ok`` or ``failed`` (with the message)."""

    status: Literal["ok", "failed"]
    detail: str | None = None


@dataclass
class FirstRequestProbe:
    """Each engine's first-request outcome since it was last seen down (by URL)."""

    hold: EngineHold = unheld  # the engine's slot for the probe: within its in-flight cap, as a keyframe
    results: dict[str, FirstRequest] = field(default_factory=dict)
    _down: set[str] = field(default_factory=set)  # seen down since its last probe: probed again when back
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def check(self, client: EngineClient, healthy: bool) -> FirstRequest | None:
        """The engine's outcome, probing it now if it is healthy and was not probed since it came up.

        None: not probed (the engine is down, or the probe could not reach it or timed out: asked again).
        A failed outcome stays while the engine is down (the real engine exits after that 500: it says why).
        """
        url = client.base_url
        if not healthy:
            self._down.add(url)  # when it is back it may be another process: probe again
            outcome = self.results.get(url)
            return outcome if outcome is not None and outcome.status == "failed" else None
        async with self._locks.setdefault(url, asyncio.Lock()):  # concurrent /readyz calls probe once
            if url in self._down:
                self._down.discard(url)
                self.results.pop(url, None)
            if url not in self.results:
                outcome = await self._probe(client, self.hold)
                if outcome is not None:
                    self.results[url] = outcome
            return self.results.get(url)

    async def passed(self, engines: EnginePool, url: str) -> bool:
        """Whether the engine at ``url`` answers and passed its probe (probing it now if it is due)."""
        client = next(slot.client for slot in engines.engines if slot.url == url)
        outcome = await self.check(client, await client.healthy())
        return outcome is not None and outcome.status == "ok"

    async def check_all(self, clients: list[EngineClient]) -> None:
        """Probe every engine that answers ``/health`` now (at start, before the gateway's other requests)."""
        async def one(client: EngineClient) -> None:
            await self.check(client, await client.healthy())

        await asyncio.gather(*(one(client) for client in clients))

    @staticmethod
    async def _probe(client: EngineClient, hold: EngineHold) -> FirstRequest | None:
        if not (await client.wire()).probes_first_request:
            return FirstRequest("ok", "not probed: not vLLM")
        try:
            linear_attention = serves_linear_attention(await client.metrics_text())
        except ModgateError:
            return None  # its /metrics could not be read: ask again
        if not linear_attention:
            return FirstRequest("ok", "not probed: no linear-attention layers")
        dtype = served_dtype(await client.server_info())  # read first: the real engine exits after that 500
        try:
            models = await client.model_ids()
            async with hold(client.base_url):
                await client.chat(probe_body(models[0] if models else ""), PROBE_REQUEST_ID)
        except UpstreamError as exc:
            if exc.code == ENGINE_REJECTED:  # a 4xx: it answered, and refusals are a request's business
                return FirstRequest("ok", exc.message)
            message = failure_message(exc.message, dtype)
            log.error("engine %s: %s", client.base_url, message)
            return FirstRequest("failed", message)
        except ModgateError:
            return None  # unreachable, loading (503) or slow: not a verdict on the engine, ask again
        return FirstRequest("ok")
