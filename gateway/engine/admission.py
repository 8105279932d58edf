"""Admission in front of the engine: at most N requests in flight, a bounded queue with deadlines, shared
fairly between tenants.

The engine runs ``max-num-seqs`` sequences at once; anything more waits inside the engine where the gateway
can neither prioritise nor shed it. So the gateway keeps the wait on its side: a slot per engine sequence,
the rest queued, refused with 429 when the queue is full or a request's deadline passes before a slot frees.

Who gets a freed slot (``fairness="tenant"``, the default): each tenant waits in a queue of its own, ordered
by the request's priority (lower first: live before background, escalation re-asks before new asks), then
arrival. Between tenants the slot goes to the backlogged tenant with the least work served per weight
(gateway/engine/fairness.py): work is the call's estimated engine time, corrected by its real usage at
the end.
A request's priority orders only its own tenant's queue: the caller sets it, so it cannot buy a larger
share. ``fairness="fifo"`` is one shared queue (priority, then arrival), as before tenants were counted.

A full queue refuses the tenant holding the most places (per weight): a newcomer from a smaller tenant
pushes out that tenant's last waiter (429 ``queue_full``) instead of being refused itself.
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

from gateway.engine.fairness import SHARED_FLOW, Fairness, FairShare, Weight, Work
from gateway.errors import Overloaded


@dataclass(order=True)
class _Waiter:
    priority: int
    order: int
    future: asyncio.Future[None] = field(compare=False)
    work: Work | None = field(compare=False, default=None)


@dataclass
class _Flow:
    """One tenant's waiters and calls in flight."""

    waiters: list[_Waiter] = field(default_factory=list)  # a heap: (priority, arrival)
    inflight: int = 0
    granted: int = 0  # slots given since start


def _granted(future: asyncio.Future[None]) -> bool:
    """Whether a waiter was handed a slot (not refused with :meth:`AdmissionQueue.fail_waiters`)."""
    return future.done() and not future.cancelled() and future.exception() is None


@dataclass(slots=True)
class Ticket:
    """What a granted slot was charged to: a tenant, and the work charged so far."""

    flow: str
    charged: float


@dataclass(frozen=True, slots=True)
class Admission:
    """A granted slot and how long it took to get it."""

    queue_seconds: float
    ticket: Ticket = field(default_factory=lambda: Ticket(SHARED_FLOW, 0.0))


@dataclass(frozen=True, slots=True)
class FlowFigures:
    """One tenant as the admission queue sees it now."""

    queued: int
    inflight: int
    granted: int
    work_served: float  # prompt-token equivalents charged since start (real usage where known)
    weight: float


class AdmissionQueue:
    """``max_inflight`` slots; up to ``queue_size`` waiters, each with its own deadline."""

    def __init__(
        self,
        max_inflight: int,
        queue_size: int,
        queue_timeout_s: float,
        *,
        fairness: Fairness = "tenant",
        weight: Weight = lambda _tenant: 1.0,
    ) -> None:
        self.max_inflight = max_inflight
        self.queue_size = queue_size
        self.queue_timeout_s = queue_timeout_s
        self.fairness = fairness
        self.share = FairShare(weight)
        self.inflight = 0
        self.peak_inflight = 0
        self.queued = 0  # requests waiting for a slot
        self._flows: dict[str, _Flow] = {}
        self._order = itertools.count()
        self._service_ewma_s = 1.0  # smoothed slot hold time, for Retry-After

    def _flow_name(self, work: Work | None) -> str:
        return SHARED_FLOW if work is None or self.fairness == "fifo" else work.tenant

    def _flow(self, name: str) -> _Flow:
        return self._flows.setdefault(name, _Flow())

    def _backlogged(self) -> list[str]:
        return [name for name, flow in self._flows.items() if flow.waiters]

    def has_spare_capacity(self) -> bool:
        """A free slot and nobody waiting: what background (shadow) work may use."""
        return self.inflight < self.max_inflight and self.queued == 0

    def retry_after_s(self) -> int:
        """A fair guess at when a slot frees for a newcomer."""
        backlog = self.queued + 1
        return max(1, math.ceil(self._service_ewma_s * backlog / max(1, self.max_inflight)))

    def figures(self) -> dict[str, FlowFigures]:
        """Each tenant seen since start: waiting, in flight, slots granted, work served (``fifo``: "")."""
        return {
            name: FlowFigures(len(flow.waiters), flow.inflight, flow.granted,
                              self.share.served.get(name, 0.0), self.share.weight(name))
            for name, flow in self._flows.items()
        }

    def _grant(self, name: str, work: Work | None) -> Ticket:
        """Take a slot for ``name`` and charge it the call's estimated work."""
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        flow = self._flow(name)
        flow.inflight += 1
        flow.granted += 1
        cost = 0.0 if work is None else work.cost
        self.share.charge(name, cost)
        return Ticket(name, cost)

    def _overflow(self, name: str) -> Overloaded | None:
        """When the queue is full: the refusal for the newcomer, or None once another's waiter made room."""
        full = Overloaded(
            f"{self.inflight} requests in flight and {self.queued} queued: the queue is full",
            retry_after=self.retry_after_s(),
            code="queue_full",
        )
        if self.fairness == "fifo" or self.queued == 0:
            return full

        def places(flow: str) -> float:
            return len(self._flows[flow].waiters) / max(1e-6, self.share.weight(flow))

        largest = max(self._backlogged(), key=places)
        newcomer = (len(self._flow(name).waiters) + 1) / max(1e-6, self.share.weight(name))
        if largest == name or places(largest) <= newcomer:
            return full
        waiters = self._flows[largest].waiters
        victim = max(waiters)  # that tenant's least urgent, newest waiter
        waiters.remove(victim)
        heapq.heapify(waiters)
        self.queued -= 1
        victim.future.set_exception(full)
        return None

    async def acquire(
        self, priority: int = 0, timeout_s: float | None = None, work: Work | None = None
    ) -> Admission:
        """Wait for a slot; raises :class:`Overloaded` when the queue is full or the deadline passes.

        ``work``: the tenant and the call's expected work (None: the shared flow, charged nothing).
        """
        started = time.monotonic()
        name = self._flow_name(work)
        if self.inflight < self.max_inflight and self.queued == 0:
            self.share.arrive(name, ())
            return Admission(0.0, self._grant(name, work))
        if self.queued >= self.queue_size:
            refusal = self._overflow(name) if self.queue_size > 0 else Overloaded(
                "the queue holds no request", retry_after=self.retry_after_s(), code="queue_full"
            )
            if refusal is not None:
                raise refusal
        flow = self._flow(name)
        if not flow.waiters:
            self.share.arrive(name, self._backlogged())
        waiter = _Waiter(priority, next(self._order), asyncio.get_running_loop().create_future(), work)
        heapq.heappush(flow.waiters, waiter)
        self.queued += 1
        try:
            async with asyncio.timeout(timeout_s if timeout_s is not None else self.queue_timeout_s):
                await waiter.future
        except TimeoutError:
            if _granted(waiter.future):
                self.release(0.0, self._ticket_of(waiter))  # handed over just as the deadline passed
            else:
                self._leave(name, waiter)
            raise Overloaded(
                f"no engine slot freed within {timeout_s or self.queue_timeout_s:g} s",
                retry_after=self.retry_after_s(),
                code="queue_timeout",
            ) from None
        except asyncio.CancelledError:
            if _granted(waiter.future):
                self.release(0.0, self._ticket_of(waiter))
            else:
                self._leave(name, waiter)
                waiter.future.cancel()
            raise
        return Admission(time.monotonic() - started, self._ticket_of(waiter))

    def admit_now(self, work: Work | None = None) -> tuple[Admission, Callable[[], None]] | None:
        """A slot now if one is free and nobody waits (else None, nothing changed), with a function that
        undoes the grant entirely, the fair share's figures included: for a call that may turn out not to
        need the engine (a verdict found with the lease's ask, gateway/engine/pool.py)."""
        if not (self.inflight < self.max_inflight and self.queued == 0):
            return None
        name = self._flow_name(work)
        before, seen = self.share.snapshot(name), name in self._flows
        self.share.arrive(name, ())
        ticket = self._grant(name, work)

        def undo() -> None:
            self._flow(name).granted -= 1
            self.share.restore(name, before)
            self.release(0.0, ticket)
            if not seen and not self._flows[name].waiters and not self._flows[name].inflight:
                del self._flows[name]

        return Admission(0.0, ticket), undo

    def _ticket_of(self, waiter: _Waiter) -> Ticket:
        return Ticket(self._flow_name(waiter.work), 0.0 if waiter.work is None else waiter.work.cost)

    def _leave(self, name: str, waiter: _Waiter) -> None:
        """A waiter gives up (deadline, cancelled) before it got a slot."""
        waiters = self._flow(name).waiters
        if waiter in waiters:
            waiters.remove(waiter)
            heapq.heapify(waiters)
            self.queued -= 1

    def try_acquire_spare(self) -> bool:
        """Take a slot only if one is free with nobody waiting (never delays live work)."""
        if not self.has_spare_capacity():
            return False
        self._grant(SHARED_FLOW, None)
        return True

    def settle(self, ticket: Ticket, actual: float) -> None:
        """Correct a call's charge with the work it really took (its usage, once the engine answered)."""
        self.share.charge(ticket.flow, actual - ticket.charged)
        ticket.charged = actual

    def release(self, held_s: float, ticket: Ticket | None = None) -> None:
        """Give a slot back and hand it to the next waiter."""
        if held_s > 0:
            self._service_ewma_s = 0.9 * self._service_ewma_s + 0.1 * held_s
        self.inflight -= 1
        flow = self._flows.get(SHARED_FLOW if ticket is None else ticket.flow)
        if flow is not None and flow.inflight > 0:
            flow.inflight -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free slots to waiters: the fair share picks the tenant, priority then arrival its waiter."""
        while self.queued and self.inflight < self.max_inflight:
            name = self.share.pick(
                self._backlogged(),
                lambda flow: (self._flows[flow].inflight / max(1e-6, self.share.weight(flow)),
                              self._flows[flow].waiters[0].order),
            )
            waiter = heapq.heappop(self._flows[name].waiters)
            self.queued -= 1
            if not waiter.future.done():
                self._grant(name, waiter.work)
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
        for flow in self._flows.values():
            while flow.waiters:
                waiter = heapq.heappop(flow.waiters)
                self.queued -= 1
                if not waiter.future.done():
                    waiter.future.set_exception(error())

    @asynccontextmanager
    async def slot(
        self, priority: int = 0, timeout_s: float | None = None, work: Work | None = None
    ) -> AsyncIterator[Admission]:
        """``async with queue.slot(): ...`` holds one engine slot."""
        admission = await self.acquire(priority, timeout_s, work)
        started = time.monotonic()
        try:
            yield admission
        finally:
            self.release(time.monotonic() - started, admission.ticket)
