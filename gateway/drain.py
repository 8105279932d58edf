"""This process's stop, in two steps: drain (still serving, ``/readyz`` 503), then shut down.

SIGTERM begins the drain (cli/serving.py). For ``period_s`` seconds (``MODGATE_SERVER__DRAIN_S``) the
listener stays open and every request is served as before, while ``/readyz`` answers 503 so a load
balancer or a Kubernetes Service stops sending new ones; responses say ``Connection: close`` so keep-alive
callers reconnect to another replica; the job worker takes no new job. Then the server stops accepting,
finishes what is in flight and closes the services (jobs still running are put back on the stream).
"""

from __future__ import annotations

import time


class Drain:
    """Whether this process is draining, since when, and for how long it keeps serving."""

    def __init__(self, period_s: float = 0.0) -> None:
        self.period_s = period_s
        self.since: float | None = None  # time.monotonic() when the drain began

    @property
    def active(self) -> bool:
        """The drain has begun: readiness is withdrawn, new jobs are not taken."""
        return self.since is not None

    def begin(self) -> bool:
        """Start draining now; False if already draining (a repeated signal changes nothing)."""
        if self.since is not None:
            return False
        self.since = time.monotonic()
        return True

    def over(self) -> bool:
        """The drain period has passed: time to stop accepting and shut down."""
        return self.since is not None and time.monotonic() - self.since >= self.period_s

    def remaining_s(self) -> float:
        """Seconds of serving left (the whole period before the drain begins)."""
        if self.since is None:
            return self.period_s
        return max(0.0, self.period_s - (time.monotonic() - self.since))
