"""Serve an ASGI app on a loopback port from a thread of its own (the embedded engine, tests, benchmarks)."""

from __future__ import annotations

import asyncio
import socket
import threading
from types import TracebackType
from typing import Any

import uvicorn

from cli.http_protocol import OnePassHttpToolsProtocol


class ThreadedServer:
    """``with ThreadedServer(app) as server: server.url`` — uvicorn on its own event loop and thread."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning", grace_s: int = 5
    ) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        # A request still running ``grace_s`` after stop() is cancelled, so the app's shutdown (its job
        # workers, its Redis clients) always runs: uvicorn would otherwise wait for it without end.
        config = uvicorn.Config(
            app, log_level=log_level, lifespan="on", access_log=False, loop="asyncio",
            timeout_graceful_shutdown=grace_s, http=OnePassHttpToolsProtocol,  # as `modgate serve`
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"asgi-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def start(self, timeout_s: float = 30.0) -> ThreadedServer:
        """Start serving and wait until the app's startup has run."""
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout_s * 100)):
            if self._server.started or not self._thread.is_alive():
                break
            deadline.wait(0.01)
        if not self._server.started:
            raise RuntimeError(f"the server on {self.url} did not start within {timeout_s:g} s")
        return self

    def exit_soon(self) -> None:
        """Stop serving without waiting (from the server's own thread: a simulated engine whose core died);
        its port refuses connections once uvicorn has closed it. ``stop`` still joins the thread."""
        self._server.should_exit = True

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the server to finish and wait for its thread; raise if it still runs after ``timeout_s``.

        A server left running after stop() would go on working (a gateway's job workers taking the next
        test's jobs from a shared Redis), so it is forced down, and never silently left behind."""
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True  # skip what is still waited for; asyncio.run cancels the rest
            self._thread.join(timeout_s)
        self._socket.close()
        if self._thread.is_alive():
            raise RuntimeError(f"the server on {self.url} did not stop within {2 * timeout_s:g} s")

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
