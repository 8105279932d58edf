"""A slot on one engine for one call (:class:`HeldEngine`), as :meth:`EnginePool.slot` hands it out: the
call moves to another engine with room when its engine cannot take it, or waits while every engine is busy."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.engine.admission import Ticket
from gateway.engine.answers import EngineAnswer, engine_failed
from gateway.engine.engine_slot import EngineSlot
from gateway.engine.fairness import Work
from gateway.engine.leases import LeaseRider
from gateway.errors import EngineBusy, EnginesBusy, EngineUnavailable

if TYPE_CHECKING:
    from gateway.engine.pool import EnginePool

log = logging.getLogger("modgate.engine_pool")

BUSY_PAUSE_S = (0.05, 1.0)
"""A call an engine answered busy asks again after 50 ms, doubling to 1 s, until the queue's deadline."""


def naming_own_model(body: dict[str, Any], models: Mapping[str, str] | None, url: str) -> dict[str, Any]:
    """``body`` naming the model the engine at ``url`` serves (``models`` by URL); as it is when unknown."""
    model = (models or {}).get(url)
    return body if model is None or body.get("model") == model else {**body, "model": model}


class HeldEngine:
    """A slot on one engine for one call; ``chat`` moves the call if the engine cannot take it."""

    def __init__(
        self,
        pool: EnginePool,
        engine: EngineSlot,
        lease: str,
        queue_seconds: float,
        ticket: Ticket | None = None,
        work: Work | None = None,
    ) -> None:
        self.pool = pool
        self.engine = engine
        self.lease = lease
        self.queue_seconds = queue_seconds  # the wait for the slot: queue and, across replicas, a lease
        self.ticket = ticket  # the tenant the slot is charged to (None: background work, charged to nobody)
        self.work = work  # what it was expected to cost (asked again if the call moves to another engine)
        self.parting: LeaseRider | None = None  # sent with the lease's release

    def part_with(self, rider: LeaseRider | None) -> None:
        """Send ``rider`` with the release of this slot's lease (it stays unrun, ``ran`` false, when the slot
        has no lease in Redis: its owner runs it alone then)."""
        self.parting = rider

    def settle(self, actual: float) -> None:
        """Correct the tenant's charge with the work the call really took (from its usage)."""
        if self.ticket is not None:
            self.pool.queue.settle(self.ticket, actual)

    async def chat(
        self, body: dict[str, Any], request_id: str, *, models: Mapping[str, str] | None = None
    ) -> EngineAnswer:
        """One chat completion; if the engine never took it, tried again on another engine with room.

        ``models``: each engine's own model id by URL, sent in its request instead of the body's (a pool
        of both kinds may serve one model under two names: vLLM refuses a name it does not serve)."""
        tried: list[EngineSlot] = []
        busy_since: float | None = None
        pause = BUSY_PAUSE_S[0]
        while True:
            engine = self.engine
            sent = naming_own_model(body, models, engine.url)
            try:
                answer = await engine.client.chat(sent, request_id)
            except EngineBusy as exc:  # back-pressure: its circuit never heard of it (engine_failed is False)
                engine.busy_answers += 1
                engine.record(False)
                engine.slots_may_have_changed()  # busy below its cap: it may have fewer slots than it said
                tried.append(engine)
                if await self.pool.move(self, tried):
                    log.info("engine %s is busy: %s moved to %s", engine.url, request_id, self.engine.url)
                    continue
                # Every other engine is full or busy: wait here, holding the slot (the engine has no room for
                # it either), then ask again; past the queue's deadline the caller hears 429, as from a queue.
                now = time.monotonic()
                busy_since = now if busy_since is None else busy_since
                remaining = busy_since + self.pool.queue.queue_timeout_s - now
                if remaining <= 0:
                    raise EnginesBusy(
                        f"every engine answered busy until the queue's deadline ({exc.message})",
                        retry_after=self.pool.queue.retry_after_s(),
                    ) from exc
                await asyncio.sleep(min(pause, remaining))
                pause = min(pause * 2, BUSY_PAUSE_S[1])
                tried = []
                continue
            except EngineUnavailable as exc:  # refused, 503 or circuit open: the engine did no work on it
                engine.record(engine_failed(exc))
                tried.append(engine)
                self.pool.refresh()
                if not await self.pool.move(self, tried):
                    raise
                engine.failovers += 1
                log.warning("engine %s could not take %s (%s): moved to %s",
                            engine.url, request_id, exc.message, self.engine.url)
                continue
            except Exception as exc:
                engine.record(engine_failed(exc))
                self.pool.refresh()
                raise
            engine.record(False)
            self.pool.refresh()
            return answer
