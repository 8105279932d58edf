"""One engine as the pool holds it (its client, cap, breaker and calls in flight), and the hold the
gateway's own calls take on it (:meth:`gateway.engine.pool.EnginePool.slot_on`)."""

from __future__ import annotations

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

    def capacity(self) -> int:
        """Calls it may have at once now: its cap when closed, one probe when half-open, none when open."""
        return {"closed": self.cap, "half_open": 1, "open": 0}[self.state]

    def room(self) -> int:
        """Calls it may still take now."""
        return max(0, self.capacity() - self.inflight)

    @property
    def recent_failures(self) -> int:
        """Engine failures among its last 20 calls (what breaks ties between equally loaded engines)."""
        return sum(self._outcomes)

    def record(self, failed: bool) -> None:
        """One call's outcome."""
        self._outcomes.append(failed)
