"""HAProxy in front of the replicas (bench/cluster.py's configuration, Debian's HAProxy) sends a request
again to the other replica when the one it went to closed the connection without answering, as a replica
killed with ``kill -9`` mid-request does: the caller gets the answer, not a 502 or a dropped connection."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from bench.cluster import HAProxy, Replica, running


class Stand(ThreadingHTTPServer):
    """A stand-in replica: ``/readyz`` 200; a POST read whole, then answered, or (``dies``) the connection
    closed without a byte of an answer."""

    def __init__(self, dies: bool) -> None:
        self.dies = dies
        self.posts = 0
        stand = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                stand.posts += 1
                if stand.dies:
                    self.close_connection = True
                    return
                self._answer()

            def _answer(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def stands() -> Iterator[list[Stand]]:
    started = [Stand(dies=True), Stand(dies=False)]
    yield started
    for stand in started:
        stand.shutdown()
        stand.server_close()


def test_a_request_whose_replica_dies_before_answering_is_answered_by_the_other(
    stands: list[Stand], tmp_path: Path
) -> None:
    replicas = [Replica(f"stand-{i}", {}, tmp_path, port=stand.server_address[1]) for i, stand in
                enumerate(stands)]
    proxy = HAProxy(replicas, tmp_path / "haproxy")
    with running(proxy):
        proxy.start()
        proxy.wait_state("stand-0", "UP")
        proxy.wait_state("stand-1", "UP")
        body = b'{"input": "' + b"x" * 200_000 + b'"}'  # a keyframe's size: more than one read of it
        answers = [httpx.post(f"{proxy.url}/v1/moderations", content=body, timeout=30) for _ in range(6)]

    assert stands[0].posts > 0  # the dying replica was sent requests
    assert [answer.status_code for answer in answers] == [200] * 6
