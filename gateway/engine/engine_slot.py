"""One engine as the pool holds it (its client, cap, breaker and calls in flight), and the hold the
gateway's own calls take on it (:meth:`gateway.engine.pool.EnginePool.slot_on`)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

from gateway.engine.circuit import CircuitBreaker, CircuitState
from gateway.engine.client import EngineClient

EngineHold = Callable[[str], AbstractAsyncContextManager[object]]
"""A slot on the engine at a URL for one of the gateway's own calls (:meth:`EnginePool.slot_on`)."""


@asynccontextmanager
async def unheld(_url: str) -> AsyncIterator[None]:
    """No slot: for a caller with no engine pool (the command line's tools talk to an engine alone)."""
    yield


@dataclass(eq=False)
class EngineSlot:
    """One engine: its client, its in-flight cap, its circuit breaker and what this replica sends it."""

    client: EngineClient
    cap: int
    circuit: CircuitBreaker
    inflight: int = 0  # calls this replica has at the engine (or is getting a lease for)
    peak_inflight: int = 0
    failovers: int = 0  # calls moved away from this engine because it could not take them
    busy_answers: int = 0  # calls it answered "busy" (its own queue full, no slot free): back-pressure
    cap_configured: bool = False  # set in MODGATE_ENGINE__CAPS: its own slot count does not replace it
    # Its slots may differ from ``cap`` now (not read yet, or it may have restarted unseen since): it takes
    # one call until they are read again (gateway/engine/slot_readings.py, one reading at a time).
    slots_unknown: bool = False
    slots_marks: int = 0  # times marked unknown: a reading begun before the latest mark does not clear it
    reading: asyncio.Task[None] | None = field(default=None, repr=False)  # the reading of its slots under way
    # Replicas it is shared with while this one cannot reach Redis: its cap here is then their share.
    shared_by: int = 1
    _outcomes: deque[bool] = field(default_factory=lambda: deque(maxlen=20))  # True: the engine failed
    default_cap: int = field(init=False)  # the cap it was given: what it returns to if it names no slots

    def __post_init__(self) -> None:
        self.default_cap = self.cap

    @property
    def url(self) -> str:
        """The engine's base URL: its name in metrics, readiness and Redis."""
        return self.client.base_url

    @property
    def state(self) -> CircuitState:
        """Its circuit's state."""
        return self.circuit.state

    @property
    def follows_slots(self) -> bool:
        """Its cap is the slot count it names (llama.cpp's ``--parallel`` in ``/props``), not a setting."""
        return not self.cap_configured and self.client.slots is not None

    def slots_may_have_changed(self) -> None:
        """Distrust its cap until its slots are read again: it failed a call, answered busy or went idle here,
        one of which a llama-server restarted under the same URL with fewer slots looks like (while a call of
        ours is in flight at it, a restart fails that call; while none is, it is idle here)."""
        if self.follows_slots:
            self.slots_unknown = True
            self.slots_marks += 1

    def slot_cap(self) -> int:
        """Calls it may have at once while closed: its cap, or one while its slots are unknown (any engine has
        one slot; more could queue inside a llama-server that restarted with fewer); while the cap holds per
        replica (Redis unreachable), this replica's share of it: the cap / ``shared_by``, at least 1."""
        return max(1, (1 if self.slots_unknown else self.cap) // self.shared_by)

    def capacity(self) -> int:
        """Calls it may have at once now: its slot cap when closed, one probe half-open, none when open."""
        return {"closed": self.slot_cap(), "half_open": 1, "open": 0}[self.state]

    def room(self) -> int:
        """Calls it may still take now."""
        return max(0, self.capacity() - self.inflight)

    @property
    def recent_failures(self) -> int:
        """Engine failures among its last 20 calls (what breaks ties between equally loaded engines)."""
        return sum(self._outcomes)

    def call_ended(self) -> None:
        """One call of this replica's ended; if it was the last, a restart from now on would fail no call of
        ours, so would go unseen: its slots are read again before the next call."""
        self.inflight -= 1
        if self.inflight == 0:
            self.slots_may_have_changed()

    def record(self, failed: bool) -> None:
        """One call's outcome (a failure may be a restart: its slots are read again before the next call)."""
        self._outcomes.append(failed)
        if failed:
            self.slots_may_have_changed()
