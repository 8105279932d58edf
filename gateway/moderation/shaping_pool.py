"""The shaping threads, shared fairly between tenants.

A plain ``ThreadPoolExecutor`` serves its queue in arrival order: a tenant that posts a hundred keyframes
puts a hundred decodes ahead of a quiet tenant's one. :class:`ShapingPool` keeps a queue per tenant in
front of the threads and hands at most one task per thread to them, picking the tenant by the same virtual
counters as admission (gateway/engine/fairness.py), charged the seconds each task ran (so a tenant of 4K
frames does not get more thread time than one of 720p frames). Work submitted without a tenant (``submit``:
checks at job submission, background work) is a flow of its own.

It is a ``concurrent.futures.Executor``: ``loop.run_in_executor(pool, fn)`` works, and
``pool.submit_for(tenant, fn, *args)`` names the tenant. State is guarded by one lock, because tasks
finish on the worker threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from gateway.engine.fairness import SHARED_FLOW, Fairness, FairShare, Weight

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(slots=True)
class _Task:
    flow: str
    future: Future[Any]
    call: Callable[[], Any]


class ShapingPool(Executor):
    """``workers`` threads; a queue per tenant in front of them (``fairness="fifo"``: one shared queue)."""

    def __init__(
        self,
        workers: int,
        *,
        fairness: Fairness = "tenant",
        weight: Weight = lambda _tenant: 1.0,
        thread_name_prefix: str = "shaping",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.workers = workers
        self.clock = clock  # what a task is charged: the time it ran (tests pass a clock of their own)
        self.fairness = fairness
        self.share = FairShare(weight)
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[_Task]] = {}
        self._running: dict[str, int] = {}
        self._shutdown = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn`` as untagged work (a flow of its own)."""
        return self.submit_for(SHARED_FLOW, fn, *args, **kwargs)

    def submit_for(self, tenant: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn`` for ``tenant`` when its turn comes."""
        flow = SHARED_FLOW if self.fairness == "fifo" else tenant
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the shaping pool is shut down")
            queue = self._queues.setdefault(flow, deque())
            if not queue:
                self.share.arrive(flow, [name for name, waiting in self._queues.items() if waiting])
            queue.append(_Task(flow, future, lambda: fn(*args, **kwargs)))
            self._dispatch()
        return future

    def queued(self) -> dict[str, int]:
        """Tasks waiting for a thread, by tenant."""
        with self._lock:
            return {flow: len(queue) for flow, queue in self._queues.items() if queue}

    def _dispatch(self) -> None:
        """Hand tasks to free threads, tenant by tenant (called with the lock held)."""
        while sum(self._running.values()) < self.workers:
            backlogged = [flow for flow, queue in self._queues.items() if queue]
            if not backlogged:
                return
            flow = self.share.pick(
                backlogged,
                lambda name: (self._running.get(name, 0) / max(1e-6, self.share.weight(name)),),
            )
            task = self._queues[flow].popleft()
            if not task.future.set_running_or_notify_cancel():
                continue  # cancelled while it waited (its caller went away)
            self._running[flow] = self._running.get(flow, 0) + 1
            self._threads.submit(self._run, task)

    def _run(self, task: _Task) -> None:
        started = self.clock()
        failed: BaseException | None = None
        try:
            result = task.call()
        except BaseException as exc:  # handed to the waiting caller, as a thread pool does
            failed = exc
        # The pool's books first, then the caller: its event loop, woken by the result, would otherwise wait
        # for this thread's lock and charge to let the GIL go (and a caller that sees the result sees the
        # thread free already).
        with self._lock:
            self._running[task.flow] -= 1
            self.share.charge(task.flow, self.clock() - started)
            if not self._shutdown:
                self._dispatch()
        if failed is None:
            task.future.set_result(result)
        else:
            task.future.set_exception(failed)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; with ``cancel_futures`` the waiting tasks are cancelled."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for queue in self._queues.values():
                    while queue:
                        queue.popleft().future.cancel()
        self._threads.shutdown(wait=wait, cancel_futures=cancel_futures)
