"""A circuit breaker per engine: stop sending work to an engine that keeps failing, probe it after a pause.

closed ──(N consecutive failures, or a failure rate over a window)──► open
open ──(cool-down passed)──► half-open: one probe call goes through, every other call is refused
half-open ──probe succeeds──► closed;  ──probe fails──► open again (a fresh cool-down)

While open, a call is refused at once with :class:`CircuitOpen` (503 and a ``Retry-After`` saying when the
probe may go): the caller learns in a millisecond what it would otherwise learn after a connect timeout,
and a struggling engine gets room to recover instead of a queue of retries.

What counts as a failure is the engine's health, not the caller's request: refused connections, 5xx,
malformed or cut answers, deadlines. A request the engine rejected as invalid (its 4xx) and a call the
client abandoned (cancelled) count as neither.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal

from gateway.errors import EngineUnavailable

log = logging.getLogger("modgate.circuit")

CircuitState = Literal["closed", "open", "half_open"]


class CircuitOpen(EngineUnavailable):
    """The engine's circuit is open: refused without trying, come back after ``retry_after`` seconds."""

    default_code = "circuit_open"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # when the engine will next be tried


class CircuitBreaker:
    """Closed → open → half-open for one engine; ``async with breaker.call(...)`` around each call."""

    def __init__(
        self,
        name: str,
        *,
        consecutive_failures: int = 5,
        failure_rate: float = 0.5,
        window: int = 20,
        min_calls: int = 10,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (
            consecutive_failures < 1
            or window < 1
            or min_calls < 1
            or not 0 < failure_rate <= 1
            or cooldown_s <= 0
        ):
            raise ValueError("circuit breaker limits must be positive (failure_rate within (0, 1])")
        self.name = name
        self.consecutive_failures = consecutive_failures
        self.failure_rate = failure_rate
        self.min_calls = min(min_calls, window)
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._outcomes: deque[bool] = deque(maxlen=window)  # True: a failure
        self._streak = 0
        self._state: CircuitState = "closed"
        self._opened_at = 0.0
        self._probing = False
        self.times_opened = 0

    @property
    def state(self) -> CircuitState:
        """The state now (an open circuit whose cool-down has passed reads as half-open)."""
        if self._state == "open" and self._clock() - self._opened_at >= self.cooldown_s:
            return "half_open"
        return self._state

    def retry_after_s(self) -> int:
        """Whole seconds until the next probe may go (at least 1)."""
        remaining = self.cooldown_s - (self._clock() - self._opened_at)
        return max(1, math.ceil(remaining))

    def before_call(self) -> bool:
        """Let a call through or raise :class:`CircuitOpen`; answers whether it is the half-open probe."""
        state = self.state
        if state == "closed":
            return False
        if state == "half_open" and not self._probing:
            self._state = "half_open"
            self._probing = True
            log.info("circuit %s: half-open, sending one probe", self.name)
            return True
        raise CircuitOpen(
            f"the engine at {self.name} is failing; calls are held off while it recovers",
            retry_after=self.retry_after_s(),
        )

    def record_success(self, probe: bool = False) -> None:
        """A call the engine answered well."""
        if probe:
            self._probing = False
        self._streak = 0
        self._outcomes.append(False)
        if self._state != "closed" and probe:
            self._state = "closed"
            self._outcomes.clear()
            log.warning("circuit %s: closed again, the probe succeeded", self.name)

    def record_failure(self, probe: bool = False) -> None:
        """A call the engine failed."""
        if probe:
            self._probing = False
            self._open("the half-open probe failed")
            return
        if self._state != "closed":
            return  # a call let through before the circuit opened, failing late: already counted
        self._streak += 1
        self._outcomes.append(True)
        failures = sum(self._outcomes)
        if self._streak >= self.consecutive_failures:
            self._open(f"{self._streak} consecutive failures")
        elif len(self._outcomes) >= self.min_calls and failures / len(self._outcomes) >= self.failure_rate:
            self._open(f"{failures} of the last {len(self._outcomes)} calls failed")

    def record_abandoned(self, probe: bool = False) -> None:
        """A call that ended without a verdict on the engine (client gone, engine rejected the request)."""
        if probe:
            self._probing = False  # let the next caller probe instead

    def _open(self, why: str) -> None:
        self._state = "open"
        self._opened_at = self._clock()
        self._streak = 0
        self._outcomes.clear()
        self.times_opened += 1
        log.warning("circuit %s: open for %g s (%s)", self.name, self.cooldown_s, why)

    @asynccontextmanager
    async def call(self, is_failure: Callable[[BaseException], bool]) -> AsyncIterator[None]:
        """Guard one call: refused while open; its outcome recorded (``is_failure`` judges exceptions)."""
        probe = self.before_call()
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, Exception) and is_failure(exc):
                self.record_failure(probe)
            else:
                self.record_abandoned(probe)
            raise
        self.record_success(probe)
