"""How ``modgate serve`` runs uvicorn: drain on SIGTERM, then stop, and exit 0 (one process or several).

Plain uvicorn, on SIGTERM, closes its listening socket at once (a caller 0.3 s later gets "connection
refused"), never lets readiness fail first, and re-raises the signal after its shutdown, so the process
ends by the signal instead of exiting 0. Here the first SIGTERM (or Ctrl-C) only begins the drain
(gateway/drain.py): for ``MODGATE_SERVER__DRAIN_S`` seconds everything is served and ``/readyz`` answers 503;
then uvicorn's own shutdown runs (stop accepting, finish the requests in flight, close the app, whose lifespan
finishes or requeues running jobs and writes the shadow records), and the process exits 0. A second Ctrl-C
stops at once, as uvicorn's does.

With ``--workers N`` uvicorn's supervisor sends each worker SIGTERM when it gets one; each worker is a
:class:`DrainingServer` too (:class:`DrainingProcess`), so each drains, and the supervisor exits 0 once
they have all stopped.
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import sys
from types import FrameType

import uvicorn
from uvicorn.supervisors import multiprocess

from gateway.drain import Drain

log = logging.getLogger("modgate.gateway")

STARTUP_FAILURE = 3  # uvicorn's exit status when the app cannot start

PROCESS_DRAIN = Drain()
"""This process's drain: the server begins it, the app (``served_app`` in a worker process) reads it."""


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM or SIGINT drains before it stops, and which then exits 0."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Begin the drain; a second Ctrl-C while draining stops now (uvicorn's own behaviour)."""
        if self.drain.active:
            if sig == signal.SIGINT:
                super().handle_exit(sig, frame)
            return  # a repeated SIGTERM (a preStop hook, then the kubelet) changes nothing
        self.drain.begin()
        # The signal is not recorded for uvicorn, which would re-raise it after shutdown: exit 0 instead.
        log.warning(
            "%s: draining for %g s (/readyz answers 503, requests are still served), then stopping",
            signal.Signals(sig).name, self.drain.period_s,
        )

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup (the app's lifespan included); then what it built is frozen out of the garbage
        collector's sight (``gc.freeze``): the app's ~200,000 long-lived objects were traversed by every
        full collection, a pause of 80 ms under load. Only in a serving process, which holds one app for its
        life (a test process makes many, and frozen objects are never collected)."""
        await super().startup(sockets)
        if self.started:
            gc.collect()
            gc.freeze()

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s); the drain's end is the signal to stop."""
        if self.drain.over():
            self.should_exit = True
        return await super().on_tick(counter)


class DrainingProcess(multiprocess.Process):
    """A worker process of uvicorn's supervisor that runs a :class:`DrainingServer`."""

    @property
    def server(self) -> uvicorn.Server:
        """The worker's server (built in the worker process, on first use)."""
        if self._server is None:
            self._server = DrainingServer(self.config, PROCESS_DRAIN)
        return self._server


class DrainingSupervisor(multiprocess.Multiprocess):
    """uvicorn's supervisor, passing SIGTERM and SIGINT on to its workers at once (it polls every 0.5 s)."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        log.warning("%s: each worker drains, then stops", signal.Signals(sig).name)
        self.should_exit.set()  # the run loop wakes now and sends each worker SIGTERM


def run(config: uvicorn.Config, drain: Drain) -> None:
    """Serve until a signal and the drain after it; exit 0 then (3 if the app failed to start)."""
    if config.workers > 1:
        # uvicorn's supervisor builds its workers by this module-level name (at start, and when it replaces
        # a dead one): every worker is then a draining one.
        multiprocess.Process = DrainingProcess  # type: ignore[misc]  # replacing uvicorn's class on purpose
        DrainingSupervisor(config, sockets=[config.bind_socket()]).run()
        return
    server = DrainingServer(config, drain)
    server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
