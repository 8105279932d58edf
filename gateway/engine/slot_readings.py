"""Each engine's own slot count read before a slot of its cap is taken (llama.cpp's ``--parallel``, in
``/props``), so a llama-server restarted with fewer slots under the same URL gets no more calls than them.

An engine whose slots may have changed unseen (:attr:`EngineSlot.slots_unknown`: never read, or since then
it failed a call, answered busy or went idle on this replica: a restart fails the calls in flight at it, so
one unseen happened while it was idle here) takes one call while its ``/props`` is read again, one reading
at a time. Readings start only when a call asks for a slot, never in the background: one taken while the
engine sat idle here would be trusted after a restart later in the same idle spell. Across replicas each
reading is recorded in Redis under a ticket taken before it began, and the
newest-begun one caps every replica's leases (gateway/engine/leases.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gateway.engine.engine_slot import EngineSlot
from gateway.engine.leases import LEASE_STORE_DOWN, EngineLeases
from gateway.tasks import stop

log = logging.getLogger("modgate.engine_pool")


def _log_failed_reading(reading: asyncio.Task[None]) -> None:
    """Say why a reading of an engine's slots broke (it stays at one call; the next call reads again)."""
    if not reading.cancelled() and (exc := reading.exception()) is not None:
        log.error("%s: the reading broke (%r); the engine takes one call until its slots are read",
                  reading.get_name(), exc)


class SlotReadings:
    """The readings of a pool's engines' slots: started by calls asking for slots, one per engine at once."""

    def __init__(
        self,
        engines: list[EngineSlot],
        leases: EngineLeases | None,
        leases_answer: Callable[[], bool],
        read: Callable[[], None],
    ) -> None:
        self.engines = engines
        self.leases = leases
        self.leases_answer = leases_answer  # whether Redis is asked now (it is not while it was failing)
        self.read_done = read  # told after each reading that answered (the pool resizes its queue)

    def start(self) -> None:
        """Start reading the slots of each engine whose slots are unknown, unless a reading of them runs."""
        for engine in self.engines:
            if engine.slots_unknown and (engine.reading is None or engine.reading.done()):
                engine.reading = asyncio.create_task(self.read(engine), name=f"slots of {engine.url}")
                engine.reading.add_done_callback(_log_failed_reading)

    async def read(self, engine: EngineSlot) -> None:
        """Read ``engine``'s slots (``/props``) and trust its cap again if it answered and nothing has marked
        it unknown since the reading began; across replicas, record the reading in Redis first."""
        marks = engine.slots_marks
        ticket = None
        if self.leases is not None and self.leases_answer():
            with contextlib.suppress(*LEASE_STORE_DOWN):
                ticket = await self.leases.slots_ticket(engine.url)
        if not await engine.client.read_slots():
            return  # still unknown: the next call asks again
        slots = engine.client.slots
        if ticket is not None and slots is not None and self.leases is not None:
            with contextlib.suppress(*LEASE_STORE_DOWN):
                await self.leases.record_slots(engine.url, ticket, slots)
        if engine.slots_marks == marks:
            engine.slots_unknown = False
        self.read_done()

    async def aclose(self) -> None:
        """Stop the readings under way."""
        await stop(*(engine.reading for engine in self.engines))
