"""A local OTLP/HTTP receiver for benchmarks: takes what a gateway exports and counts it.

No OpenTelemetry Collector can be installed from PyPI or Debian here (it ships as Go binaries and
container images), so the overhead benchmark's production path exports to this instead: it answers
``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs`` with 200 and an empty protobuf body, as a collector
does, and counts the requests and bytes (``GET /sink/info``). The exporter's work in the gateway (batching,
protobuf encoding, the HTTP posts) is all real; only the collector's own processing is left out.

    python -m bench.otlp_sink --port 4318
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SIGNALS = ("/v1/traces", "/v1/metrics", "/v1/logs")


class OtlpSink:
    """ASGI app: OTLP/HTTP exports accepted and counted."""

    def __init__(self) -> None:
        self.requests = dict.fromkeys(SIGNALS, 0)
        self.bytes = dict.fromkeys(SIGNALS, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request."""
        if scope["type"] != "http":
            return
        size = 0
        more = True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
        path = scope["path"]
        if scope["method"] == "POST" and path in SIGNALS:
            self.requests[path] += 1
            self.bytes[path] += size
            status, body, kind = 200, b"", b"application/x-protobuf"
        elif path == "/sink/info":
            status, kind = 200, b"application/json"
            body = json.dumps({"requests": self.requests, "bytes": self.bytes}).encode()
        else:
            status, body, kind = 404, b"", b"text/plain"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


def main() -> None:
    """Serve the sink."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    uvicorn.run(OtlpSink(), host=args.host, port=args.port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
