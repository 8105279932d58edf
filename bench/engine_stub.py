"""An engine that costs next to nothing: the instant simulator's answers, replayed per distinct request body.

Why not the simulator itself: at time scale 0 it still decodes every JPEG to read its label, renders ~1,100
prompt tokens and streams ~20 chunks through Litestar — about 10 ms of CPU a request on these machines, as
much as the gateway overhead being measured, on the same two cores. Here the first request with a given
body goes through the real simulator (``create_sim_app``, instant preset, time scale 0) and its whole
response is kept; every later request with the same bytes gets those bytes back as one write. The answers
are the simulator's, byte for byte (verdict, reasoning, usage, SSE framing), so the gateways parse exactly
what they would; only the cost is gone. Everything else (``/health``, ``/v1/models``, ``/tokenize``,
``/metrics``) is the simulator's, unmemoized.

    python -m bench.engine_stub --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from deploy.simulator import PRESETS, create_sim_app

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

REPLAYED_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Recorded:
    """One whole response of the simulator."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _record(app: ASGIApp, scope: Scope, body: bytes) -> Recorded:
    """Run one request through the simulator and keep its whole response."""
    delivered = False
    finished = asyncio.Event()  # a server says "disconnect" once the response is out; Litestar waits for it

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    status = 500
    headers: list[tuple[bytes, bytes]] = []
    parts: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in _FRAMING]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                finished.set()

    await app(scope, receive, send)
    return Recorded(status, headers, b"".join(parts))


_FRAMING = {b"content-length", b"transfer-encoding"}


def canonical(body: bytes) -> str:
    """The request a body makes, whatever its serialisation: its JSON with keys sorted."""
    try:
        return json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return body.decode(errors="replace")


class ReplayingEngine:
    """ASGI app: chat completions replayed per distinct body, the rest passed to the simulator.

    It also counts what it was asked: distinct bodies (bytes) and distinct requests (the same JSON however
    serialised, ``canonical``), in all and since the last ``POST /stub/mark`` (a gateway's own requests
    at start, its prefix priming among them, come before the benchmark's mark), and keeps the last body,
    so a benchmark can post exactly what a gateway sent and show that every arm asked the same.
    """

    def __init__(self, simulator: ASGIApp) -> None:
        self.simulator = simulator
        self.recorded: dict[bytes, Recorded] = {}
        self.requests: dict[bytes, str] = {}  # body -> canonical request, computed once per distinct body
        self.since_mark: set[str] = set()  # the canonical requests asked since the last mark
        self.last_body = b""
        self.asked = 0  # chat requests, replayed or not
        self.replays = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection event."""
        if scope["type"] != "http" or scope["path"] != REPLAYED_PATH or scope["method"] != "POST":
            if scope["type"] == "http" and scope["path"] == "/stub/info":
                await self._info(send)
                return
            if scope["type"] == "http" and scope["path"] == "/stub/last":
                await _send_json(send, self.last_body)
                return
            if scope["type"] == "http" and scope["path"] == "/stub/mark" and scope["method"] == "POST":
                self.since_mark.clear()
                await _send_json(send, b"{}")
                return
            await self.simulator(scope, receive, send)
            return
        body = await _read_body(receive)
        self.last_body = body
        self.asked += 1
        answer = self.recorded.get(body)
        if answer is None:
            self.requests[body] = canonical(body)
            answer = await _record(self.simulator, scope, body)
            if answer.status == 200:
                self.recorded[body] = answer
        else:
            self.replays += 1
        self.since_mark.add(self.requests[body])
        headers = [*answer.headers, (b"content-length", str(len(answer.body)).encode())]
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})

    async def _info(self, send: Send) -> None:
        info = {"distinct_bodies": len(self.recorded), "distinct_requests": len(set(self.requests.values())),
                "distinct_since_mark": len(self.since_mark), "requests": self.asked, "replays": self.replays}
        await _send_json(send, json.dumps(info).encode())


async def _send_json(send: Send, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_stub_app() -> ReplayingEngine:
    """The replaying engine in front of the instant simulator at time scale 0."""
    simulator: Any = create_sim_app(PRESETS["instant"], 0.0)  # Litestar types its ASGI call more narrowly
    return ReplayingEngine(simulator)


def main() -> None:
    """Serve the stub (uvicorn, uvloop, httptools: the fastest stack at hand, so the stub stays cheap)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(create_stub_app(), host=args.host, port=args.port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
