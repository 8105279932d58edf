"""Several engines behind one gateway: each with its own in-flight cap, one shared priority queue in front.

``async with pool.slot(priority) as held: await held.chat(body, request_id)``

- Choice: a half-open engine's probe first, else the least-loaded engine that has room (in flight / cap,
  ties to the one with fewer recent failures, then to the one listed first).
- Waiting: when every engine is full, requests wait in ONE :class:`AdmissionQueue` (tenants' shares of
  engine work, priority inside a tenant, deadline, 429 with ``Retry-After`` when full), whose size the
  pool keeps equal to the engines' in-flight work plus their free room. A request is granted a place
  there first, then given an engine with room.
- Down engines: each engine's :class:`CircuitBreaker` (gateway/engine/circuit.py) decides. An open circuit
  gives its engine no room; after the cool-down it gives room for exactly one probe. When no engine would
  take a call now, a request is refused at once (503 ``circuit_open`` with ``Retry-After``) instead of
  queueing.
- Failover: a call its engine never took (connection refused, 503, circuit open) moves to another engine
  with room, once per engine; anything the engine may have started (timeouts, cut streams) is not retried.
- Busy engines: an engine's own "busy" answer (vLLM past ``--max-num-queued-reqs``, llama-server with no
  slot free: :class:`~gateway.errors.EngineBusy`) is back-pressure, not a failure: its circuit is untouched,
  ``modgate_engine_busy_total`` counts it, and the call moves to another engine with room or waits here
  (holding its slot, asking again from 50 ms doubling to 1 s) until the queue's deadline, then 429
  ``engine_busy``.
- Replicas: with :class:`EngineLeases` (Redis) a request also needs a lease on its engine, so the engine's
  cap holds across every replica. A request whose engines' shared slots are all taken by other replicas
  asks Redis again (10 ms, doubling to 100 ms; 50 ms with fair leases) until its deadline. With fair leases
  (the default) Redis also decides which tenant a freed slot goes to, across every replica; priority order
  holds within a replica. Each replica says it is there every ``refresh_every_s`` (a heartbeat in the
  leases' registry, which also tells it how many replicas share the engines). When Redis cannot be reached
  the pool serves on its share of each cap, the cap divided by the replicas last seen (at least 1; logged
  loudly, ``modgate_engine_leases_local_only`` 1), and takes a local slot only once its heartbeat is stale
  to the others, who from then on hold its share back (gateway/engine/leases.py): two replicas on an
  engine of 4 run 2 each, never 8. When Redis answers again the calls running on local slots are adopted
  as leases first (added whatever the cap, so the shared count is what the engine has), then new ones are
  asked. A replica that never reached Redis knows no others and serves on the whole cap.
- Riders: a caller's Lua may ride with the lease's acquire (:meth:`EnginePool.slot`'s ``rider``: taken
  only when a slot is free now, and withheld, with nothing of the slot left taken, when the rider found
  something: :class:`SlotWithheld`) and with its release (:meth:`HeldEngine.part_with`), so the verdict
  cache's lookup and store cost no round trip of their own (gateway/engine/leases.py).
- llama.cpp: an engine's cap (and its leases') is its ``--parallel`` slots from ``/props`` unless configured,
  read before a slot of it is taken; the newest reading caps every replica (gateway/engine/slot_readings.py).
- The gateway's own calls (the start-up check's probes, the first-request probe, the prefix primer) name
  their engine: :meth:`EnginePool.slot_on` holds a slot of that engine's cap (and its lease) for them,
  outside the tenants' queue, so the cap is a promise to the engine whatever asks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from gateway.engine.admission import AdmissionQueue
from gateway.engine.circuit import CircuitBreaker, CircuitOpen
from gateway.engine.client import EngineClient
from gateway.engine.engine_slot import EngineSlot
from gateway.engine.fairness import Work
from gateway.engine.held_engine import HeldEngine, naming_own_model
from gateway.engine.leases import LEASE_STORE_DOWN, EngineLeases, LeaseRider
from gateway.engine.slot_readings import SlotReadings
from gateway.errors import Overloaded, ServerSideError
from gateway.tasks import stop

log = logging.getLogger("modgate.engine_pool")

T = TypeVar("T")

LOCAL_ONLY = ""
"""The lease of a slot taken without Redis (none configured, or Redis unreachable): nothing to give back."""


class SlotWithheld(Exception):
    """No slot was taken for a call that asked with a rider: the rider found something (``rider.result``),
    or it could not ride now (``rider.ran`` false: the caller does its own reads first, then asks again)."""

    def __init__(self, rider: LeaseRider) -> None:
        super().__init__("the slot was withheld")
        self.rider = rider


class EnginePool:
    """Engines, one shared admission queue, and (across replicas) Redis leases on each engine's slots."""

    def __init__(
        self,
        engines: list[EngineSlot],
        queue: AdmissionQueue,
        leases: EngineLeases | None = None,
        *,
        lease_retry_after_failure_s: float = 5.0,
        lease_poll_s: tuple[float, float] = (0.01, 0.1),
        refresh_every_s: float = 0.5,
        fair_leases: bool = False,
        weight: Callable[[str], float] = lambda _tenant: 1.0,
    ) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        if len({engine.url for engine in engines}) != len(engines):
            raise ValueError("an engine is listed twice")
        self.engines = engines
        self.queue = queue
        self.leases = leases
        self.lease_retry_after_failure_s = lease_retry_after_failure_s
        self.lease_poll_s = lease_poll_s
        self.refresh_every_s = refresh_every_s
        # One fair share across replicas: Redis picks the tenant a free slot goes to (EngineLeases).
        self.fair_leases = fair_leases and leases is not None
        self.weight = weight
        self._leases_down_until = 0.0  # while Redis was failing: serve on local caps, do not ask it
        self.leases_local_only = False
        self._local_from = 0.0  # local slots only from then: the others hold our share back by then
        self._unleased: dict[str, int] = {}  # engine URL -> running calls taken on local slots, not adopted
        self._adopted: dict[str, list[str]] = {}  # engine URL -> leases adopted for such calls, to give back
        self._adopting = False  # no local slot is taken while the running ones are being adopted
        self._rejoining = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None
        self.slot_readings = SlotReadings(
            engines, leases, lambda: time.monotonic() >= self._leases_down_until, self.refresh)
        self.refresh()

    @classmethod
    def of_one(cls, engine: EngineClient, queue: AdmissionQueue) -> EnginePool:
        """The single-engine pool: ``engine`` with the queue's size as its cap."""
        # An engine built without a breaker gets one that no call feeds: it stays closed, as before.
        circuit = engine.circuit or CircuitBreaker(engine.base_url)
        return cls([EngineSlot(engine, queue.max_inflight, circuit)], queue)

    # --- lifecycle ---

    def start(self) -> None:
        """Renew leases (with Redis) and notice circuits whose cool-down has passed while requests wait."""
        if self.leases is not None:
            self.leases.start()
        if self._watch is None:
            self._watch = asyncio.create_task(self._refresh_forever(), name="engine-pool-refresh")

    async def _refresh_forever(self) -> None:
        while True:  # the first heartbeat at once: the other replicas count this one from its start
            self.refresh()
            if self.leases is not None and not self.leases_local_only:
                with contextlib.suppress(*LEASE_STORE_DOWN):  # a call that fails says so on its own
                    await self.leases.beat()
            elif self.leases is not None and time.monotonic() >= self._leases_down_until:
                # A replica that is idle, or whose every answer is a reused verdict, asks Redis no lease:
                # without this it would say it holds the caps alone (and alert) long after Redis came back.
                await self._rejoin()
            await asyncio.sleep(self.refresh_every_s)

    @property
    def calls_on_local_caps(self) -> int:
        """Running calls taken on local slots that the shared cap does not count (not adopted yet)."""
        return sum(self._unleased.values())

    def _leases_failed(self, exc: BaseException) -> None:
        self._leases_down_until = time.monotonic() + self.lease_retry_after_failure_s
        if not self.leases_local_only:
            assert self.leases is not None
            seen, after = self.leases.replicas_seen, self.leases.local_after()
            # Local slots once the others see our heartbeat stale and hold our share back.
            self._local_from = 0.0 if after is None else after
            for engine in self.engines:
                engine.shared_by = seen
            log.error(
                "engine leases: Redis unreachable (%r); serving on this replica's share of each cap (the"
                " cap / %d replicas last seen) until it answers (asking again in %g s)",
                exc, seen, self.lease_retry_after_failure_s,
            )
        self.leases_local_only = True
        self.refresh()

    async def _rejoin(self) -> bool:
        """Redis answers again: adopt the calls running on local slots as leases, then the caps hold across
        replicas again (True); False when Redis fails meanwhile (still on local shares)."""
        assert self.leases is not None
        async with self._rejoining:
            if not self.leases_local_only:
                return True
            self._adopting = True
            try:
                for engine in self.engines:
                    running = self._unleased.get(engine.url, 0)
                    members = await self.leases.adopt(engine.url, running)
                    still = self._unleased.get(engine.url, 0)
                    self._adopted.setdefault(engine.url, []).extend(members[:still])
                    self._unleased[engine.url] = 0
                    # calls that ended while Redis answered gave back no lease yet: theirs go back now (no
                    # longer renewed even if this fails, so they lapse)
                    for member in members[still:]:
                        with contextlib.suppress(*LEASE_STORE_DOWN):
                            await self.leases.release(engine.url, member)
                await self.leases.beat()  # only after adopting: the others stop holding our share back
            except LEASE_STORE_DOWN as exc:
                self._leases_failed(exc)
                return False
            finally:
                self._adopting = False
            self._leases_down_until = 0.0
            self.leases_local_only = False
            for engine in self.engines:
                engine.shared_by = 1
            log.warning("engine leases: Redis answers again; the calls on local slots adopted as leases, "
                        "engine caps hold across replicas again")
            self.refresh()
            return True

    def _local_lease(self, engine: EngineSlot) -> str | None:
        """A local slot of ``engine`` while Redis cannot be asked (:data:`LOCAL_ONLY`), within this replica's
        share of its cap; None (ask again) while its share is full, before the others hold it back, or while
        the running ones are being adopted."""
        if self.leases is None:
            return LOCAL_ONLY
        if self._adopting or time.monotonic() < self._local_from or engine.inflight > engine.slot_cap():
            return None
        self._unleased[engine.url] = self._unleased.get(engine.url, 0) + 1
        return LOCAL_ONLY

    async def aclose(self) -> None:
        """Stop the background tasks, give back leases, close every engine's connections."""
        await stop(self._watch)
        await self.slot_readings.aclose()
        if self.leases is not None:
            await self.leases.aclose()
        for engine in self.engines:
            await engine.client.aclose()

    # --- what the rest of the gateway reads ---

    async def detect_engines(self, timeout_s: float = 5.0) -> None:
        """Ask each engine what it is (kind, slots) now rather than on its first call; never fails."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(self.slot_readings.read(engine) for engine in self.engines))
        self.refresh()

    def kind_of(self, url: str, default: str) -> str:
        """The kind of the engine at ``url`` as detected (``vllm`` or ``llamacpp``); ``default`` before it is
        known or for a URL outside the pool."""
        kind = next((engine.client.kind for engine in self.engines if engine.url == url), "unknown")
        return default if kind == "unknown" else kind

    def engines_counting_no_images(self) -> list[str]:
        """The URLs of the engines known to leave images out of their token count and usage (llama.cpp): a
        request with images cannot be predicted for them. As detected, without asking (an engine down must
        not hold up a request)."""
        return [engine.url for engine in self.engines if not engine.client.counts_image_tokens]

    async def model_ids(self) -> list[str]:
        """The served models (``GET /v1/models``) of the first engine that answers."""
        return await self._ask_any(lambda client: client.model_ids())

    async def tokenize(self, body: dict[str, Any], *, models: Mapping[str, str] | None = None) -> int:
        """A prompt's token count (``POST /tokenize``) from the first engine that answers, asked under its own
        model id (``models`` by URL, as :meth:`HeldEngine.chat`)."""
        return await self._ask_any(
            lambda client: client.tokenize(naming_own_model(body, models, client.base_url))
        )

    async def _ask_any(self, call: Callable[[EngineClient], Awaitable[T]]) -> T:
        """A call that needs no slot, to each engine (open circuits last) until one answers.

        Every engine serves the same model, so any answer will do; a dead engine whose circuit has not opened
        yet (nothing has called it) must not hold up readiness while another one answers.
        """
        ordered = sorted(self.engines, key=lambda engine: engine.state == "open")
        failure: ServerSideError | None = None
        for engine in ordered:
            try:
                return await call(engine.client)
            except ServerSideError as exc:
                failure = exc
        assert failure is not None  # a pool has at least one engine
        raise failure

    def has_spare_capacity(self) -> bool:
        """A free slot and nobody waiting: what background work may use (see :meth:`spare_slot`)."""
        self.refresh()
        return self.queue.has_spare_capacity()

    async def readiness(self) -> list[dict[str, Any]]:
        """Each engine: answers ``/health``, its circuit, in flight and cap (``up``: it would take calls)."""
        healthy = await asyncio.gather(*(engine.client.healthy() for engine in self.engines))
        return [
            {"url": engine.url, "up": ok and engine.state != "open", "health": ok, "circuit": engine.state,
             "inflight": engine.inflight, "cap": engine.cap, "kind": engine.client.kind}
            for engine, ok in zip(self.engines, healthy, strict=True)
        ]

    # --- slots ---

    def refresh(self) -> None:
        """Size the shared queue to what the engines can take now; refuse waiters when no engine would.

        An engine that says how many slots it has (llama.cpp's ``--parallel``, in ``/props``) is capped at
        them unless MODGATE_ENGINE__CAPS sets its cap: more would only queue inside llama-server, where no
        priority or tenant share holds.
        """
        for engine in self.engines:
            if not engine.cap_configured:  # re-read: a restarted llama-server may have other slots
                engine.cap = engine.client.slots or engine.default_cap
        self.queue.resize(sum(engine.inflight + engine.room() for engine in self.engines))
        if self.queue.queued and not self._any_engine_accepts():
            self.queue.fail_waiters(self._refusal)

    def _any_engine_accepts(self) -> bool:
        """Whether some engine is up, or has a probe slot free: else waiting is pointless."""
        return any(engine.state == "closed" or engine.room() > 0 for engine in self.engines)

    def _refusal(self) -> CircuitOpen:
        soonest = min(engine.circuit.retry_after_s() for engine in self.engines)
        which = (f"the engine at {self.engines[0].url} is" if len(self.engines) == 1
                 else f"all {len(self.engines)} engines are")
        return CircuitOpen(f"{which} failing; calls are held off until the next probe", retry_after=soonest)

    def _candidates(self, exclude: list[EngineSlot] | tuple[()] = ()) -> list[EngineSlot]:
        """Engines with room: a half-open one's probe first, then least loaded, fewer recent failures, listed.

        The probe goes first because under light load an engine with past failures would otherwise never be
        picked again, so never probed, so never back; if the probe cannot connect, the call moves on.
        """
        order = {id(engine): index for index, engine in enumerate(self.engines)}
        return sorted(
            (engine for engine in self.engines if engine.room() > 0 and engine not in exclude),
            key=lambda e: (e.state != "half_open", e.inflight / e.cap, e.recent_failures, order[id(e)]),
        )

    def _reserve(self, engine: EngineSlot) -> None:
        engine.inflight += 1
        engine.peak_inflight = max(engine.peak_inflight, engine.inflight)

    def _unreserve(self, engine: EngineSlot) -> None:
        engine.inflight -= 1
        self.refresh()

    def can_carry(self, rider: LeaseRider) -> bool:
        """Whether a lease asked now would carry ``rider``: leases in its Redis, and that Redis answering."""
        return (self.leases is not None and self.leases.carries(rider)
                and time.monotonic() >= self._leases_down_until)

    async def _lease(
        self, engine: EngineSlot, work: Work | None = None, rider: LeaseRider | None = None
    ) -> str | None:
        """A lease on ``engine`` across replicas (:data:`LOCAL_ONLY` without Redis); None: all taken, or
        (fair leases) a tenant waiting on some replica has been served less than ``work``'s, or ``rider``
        withheld it."""
        if self.leases is None:
            return LOCAL_ONLY
        if time.monotonic() < self._leases_down_until:
            return self._local_lease(engine)
        if self.leases_local_only and not await self._rejoin():
            return self._local_lease(engine)
        try:
            cap, follows = engine.slot_cap(), engine.follows_slots
            if self.fair_leases:
                tenant = "" if work is None else work.tenant
                share = 0.0 if work is None else work.cost / max(1e-6, self.weight(work.tenant))
                lease = await self.leases.try_acquire_fair(engine.url, cap, tenant, share, rider,
                                                           follows_slots=follows)
            else:
                lease = await self.leases.try_acquire(engine.url, cap, rider, follows_slots=follows)
        except LEASE_STORE_DOWN as exc:
            self._leases_failed(exc)
            return self._local_lease(engine)
        # A call that was already waiting on Redis when another timed out may come back granted: Redis
        # answers, so the calls taken on local slots meanwhile are adopted and every call asks it again.
        self._leases_down_until = 0.0
        if self.leases_local_only:
            await self._rejoin()
        return lease

    async def _take_one(
        self, exclude: list[EngineSlot] | tuple[()] = (), work: Work | None = None,
        rider: LeaseRider | None = None,
    ) -> tuple[EngineSlot, str] | None:
        """One pass over the engines with room: the first whose lease is granted, or None. ``rider`` rides
        with the first lease asked (:class:`SlotWithheld` if it withholds it)."""
        self.slot_readings.start()
        for engine in self._candidates(exclude):
            if engine.room() <= 0:  # taken by another request while we asked Redis about an earlier one
                continue
            self._reserve(engine)  # before the await: nobody else counts on this room meanwhile
            try:
                lease = await self._lease(engine, work, rider)
            except BaseException:
                self._unreserve(engine)
                raise
            if lease is not None:
                return engine, lease
            self._unreserve(engine)
            if rider is not None and rider.withheld:
                raise SlotWithheld(rider)
            rider = None
        return None

    async def _take(
        self, deadline: float, work: Work | None = None, rider: LeaseRider | None = None
    ) -> tuple[EngineSlot, str]:
        """An engine with room and a lease on it, waiting (polling Redis) until ``deadline`` if need be;
        ``rider`` rides with the first lease asked."""
        pause, longest = self.lease_poll_s
        while True:
            taken = await self._take_one(work=work, rider=rider)
            rider = None
            if taken is not None:
                return taken
            if not self._any_engine_accepts():
                raise self._refusal()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Overloaded(
                    "every engine slot stayed taken (by this or other gateway replicas) until the deadline",
                    retry_after=self.queue.retry_after_s(), code="queue_timeout",
                )
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, longest)

    async def _give_back(self, engine: EngineSlot, lease: str, rider: LeaseRider | None = None) -> None:
        """Release the lease (best effort: unrenewed, it expires anyway; ``rider`` with it), then the local
        count."""
        try:
            if lease == LOCAL_ONLY and self.leases is not None:
                adopted = self._adopted.get(engine.url)
                if adopted:  # local calls are alike: any of the leases adopted for them goes back
                    with contextlib.suppress(*LEASE_STORE_DOWN):
                        await self.leases.release(engine.url, adopted.pop())
                else:
                    self._unleased[engine.url] -= 1
            elif lease != LOCAL_ONLY and self.leases is not None:
                with contextlib.suppress(*LEASE_STORE_DOWN):
                    await self.leases.release(engine.url, lease, rider)
        finally:
            engine.call_ended()

    async def move(self, held: HeldEngine, tried: list[EngineSlot]) -> bool:
        """Move ``held`` to an engine not yet tried that has room now (never waits); False if none has."""
        taken = await self._take_one(exclude=tried, work=held.work)
        if taken is None:
            return False
        old_engine, old_lease = held.engine, held.lease
        held.engine, held.lease = taken
        await self._give_back(old_engine, old_lease)
        self.refresh()
        return True

    @asynccontextmanager
    async def slot(
        self, priority: int = 0, timeout_s: float | None = None, work: Work | None = None,
        rider: LeaseRider | None = None,
    ) -> AsyncIterator[HeldEngine]:
        """Hold a slot on the least-loaded engine that is up (429: waited too long; 503: all are down).

        ``work``: the tenant asking and its expected work, for the fair share (gateway/engine/admission.py).
        ``rider``: Lua sent with the lease's acquire; with one, a slot is taken only if one is free now and
        the rider rode with its lease, else :class:`SlotWithheld` leaves everything as it was.
        """
        started = time.monotonic()
        self.slot_readings.start()
        self.refresh()
        if not self._any_engine_accepts():
            raise self._refusal()
        undo = None
        if rider is None:
            admission = await self.queue.acquire(priority, timeout_s, work)
        elif (admitted := self.queue.admit_now(work)) is None:
            raise SlotWithheld(rider)  # it would wait: the caller reads first, then waits without a rider
        else:
            admission, undo = admitted
        deadline = started + (timeout_s if timeout_s is not None else self.queue.queue_timeout_s)
        try:
            engine, lease = await self._take(deadline, work, rider)
            if rider is not None and not rider.ran:  # no lease in Redis carried it (it went down meanwhile)
                await self._give_back(engine, lease)
                raise SlotWithheld(rider)
        except SlotWithheld:
            assert undo is not None
            undo()
            self.refresh()
            raise
        except BaseException:
            self.queue.release(0.0, admission.ticket)
            self.refresh()
            raise
        held = HeldEngine(self, engine, lease, time.monotonic() - started, admission.ticket, work)
        async with self._holding(held):
            yield held

    @asynccontextmanager
    async def slot_on(self, url: str, timeout_s: float = 60.0) -> AsyncIterator[EngineSlot]:
        """A slot on the engine at ``url`` for the gateway's own call, within its cap and (across replicas)
        its lease, waiting for room (polling, as a keyframe waits for a lease) until ``timeout_s``.

        Outside the tenants' queue and its circuit: a probe or a primer is charged to nobody and goes to the
        engine it names, up or not; it only never makes the engine run more than its cap."""
        engine = next((slot for slot in self.engines if slot.url == url), None)
        if engine is None:
            raise ValueError(f"{url} is not an engine of the pool")
        deadline = time.monotonic() + timeout_s
        pause, longest = self.lease_poll_s
        while True:
            lease = None
            self.slot_readings.start()
            if engine.inflight < engine.slot_cap():
                self._reserve(engine)
                try:
                    lease = await self._lease(engine)
                except BaseException:
                    self._unreserve(engine)
                    raise
                if lease is None:
                    self._unreserve(engine)
            if lease is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Overloaded(
                    f"the engine at {url} stayed at its cap of {engine.slot_cap()} for {timeout_s:g} s",
                    retry_after=self.queue.retry_after_s(), code="queue_timeout",
                )
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, longest)
        self.refresh()
        try:
            yield engine
        finally:
            try:
                await self._give_back(engine, lease)
            finally:
                self.refresh()

    @asynccontextmanager
    async def spare_slot(self) -> AsyncIterator[HeldEngine | None]:
        """A slot for background work only if one is free with nobody waiting (else None); never waits."""
        self.refresh()
        taken = None
        if self.queue.try_acquire_spare():
            try:
                taken = await self._take_one()
            finally:
                if taken is None:
                    self.queue.release(0.0)
                    self.refresh()
        if taken is None:
            yield None
            return
        held = HeldEngine(self, taken[0], taken[1], 0.0)
        async with self._holding(held):
            yield held

    @asynccontextmanager
    async def _holding(self, held: HeldEngine) -> AsyncIterator[None]:
        since = time.monotonic()
        try:
            yield
        finally:
            try:
                await self._give_back(held.engine, held.lease, held.parting)
            finally:
                self.queue.release(time.monotonic() - since, held.ticket)
                self.refresh()
