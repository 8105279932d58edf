"""Admission in front of the engine: at most N requests in flight, a bounded priority queue with deadlines.

The engine runs ``max-num-seqs`` sequences at once; anything more waits inside the engine where the gateway
can neither prioritise nor shed it. So the gateway keeps the wait on its side: a slot per engine sequence,
the rest queued by priority (lower first, then arrival), refused with 429 when the queue is full or a
request's deadline passes before a slot frees.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from gateway.errors import Overloaded


@dataclass(order=True)
class _Waiter:
    priority: int
    order: int
    future: asyncio.Future[None] = field(compare=False)


def _granted(future: asyncio.Future[None]) -> bool:
    """Whether a waiter was handed a slot (not refused with :meth:`AdmissionQueue.fail_waiters`)."""
    return future.done() and not future.cancelled() and future.exception() is None


@dataclass(frozen=True, slots=True)
class Admission:
    """A granted slot and how long it took to get it."""

    queue_seconds: float


class AdmissionQueue:
    """``max_inflight`` slots; up to ``queue_size`` waiters, each with its own deadline."""

    def __init__(self, max_inflight: int, queue_size: int, queue_timeout_s: float) -> None:
        self.max_inflight = max_inflight
        self.queue_size = queue_size
        self.queue_timeout_s = queue_timeout_s
        self.inflight = 0
        self.peak_inflight = 0
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()
        self._service_ewma_s = 1.0  # smoothed slot hold time, for Retry-After

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return sum(1 for w in self._waiters if not w.future.done())

    def has_spare_capacity(self) -> bool:
        """A free slot and nobody waiting: what background (shadow) work may use."""
        return self.inflight < self.max_inflight and self.queued == 0

    def retry_after_s(self) -> int:
        """A fair guess at when a slot frees for a newcomer."""
        backlog = self.queued + 1
        return max(1, math.ceil(self._service_ewma_s * backlog / max(1, self.max_inflight)))

    def _take(self) -> None:
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)

    async def acquire(self, priority: int = 0, timeout_s: float | None = None) -> Admission:
        """Wait for a slot; raises :class:`Overloaded` when the queue is full or the deadline passes."""
        started = time.monotonic()
        if self.inflight < self.max_inflight and self.queued == 0:
            self._take()
            return Admission(0.0)
        if self.queued >= self.queue_size:
            raise Overloaded(
                f"{self.inflight} requests in flight and {self.queued} queued: the queue is full",
                retry_after=self.retry_after_s(),
                code="queue_full",
            )
        waiter = _Waiter(priority, next(self._order), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiters, waiter)
        try:
            async with asyncio.timeout(timeout_s if timeout_s is not None else self.queue_timeout_s):
                await waiter.future
        except TimeoutError:
            if _granted(waiter.future):
                self.release(0.0)  # the slot was handed over just as the deadline passed: give it back
            raise Overloaded(
                f"no engine slot freed within {timeout_s or self.queue_timeout_s:g} s",
                retry_after=self.retry_after_s(),
                code="queue_timeout",
            ) from None
        except asyncio.CancelledError:
            if _granted(waiter.future):
                self.release(0.0)
            else:
                waiter.future.cancel()
            raise
        return Admission(time.monotonic() - started)

    def try_acquire_spare(self) -> bool:
        """Take a slot only if one is free with nobody waiting (never delays live work)."""
        if not self.has_spare_capacity():
            return False
        self._take()
        return True

    def release(self, held_s: float) -> None:
        """Give a slot back and hand it to the best waiter."""
        if held_s > 0:
            self._service_ewma_s = 0.9 * self._service_ewma_s + 0.1 * held_s
        self.inflight -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free slots to the best waiters."""
        while self._waiters and self.inflight < self.max_inflight:
            waiter = heapq.heappop(self._waiters)
            if not waiter.future.done():
                self._take()
                waiter.future.set_result(None)

    def resize(self, max_inflight: int) -> None:
        """Change the number of slots (an engine pool's engines going down and coming back).

        New room goes to waiters at once; fewer slots than in flight just means no hand-over until enough
        calls finish.
        """
        self.max_inflight = max_inflight
        self._hand_over()

    def fail_waiters(self, error: Callable[[], Exception]) -> None:
        """Wake every waiter with ``error()`` (no slot can free: every engine is down)."""
        while self._waiters:
            waiter = heapq.heappop(self._waiters)
            if not waiter.future.done():
                waiter.future.set_exception(error())

    @asynccontextmanager
    async def slot(self, priority: int = 0, timeout_s: float | None = None) -> AsyncIterator[Admission]:
        """``async with queue.slot(): ...`` holds one engine slot."""
        admission = await self.acquire(priority, timeout_s)
        started = time.monotonic()
        try:
            yield admission
        finally:
            self.release(time.monotonic() - started)
