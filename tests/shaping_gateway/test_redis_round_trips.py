"""What a keyframe costs in Redis: the verdict cache's lookup rides with the engine lease's acquire and its
store with the lease's release, so a judged keyframe is two commands (two round trips), a reused one is one.

Counted with ``MONITOR`` on the test's real Redis: every command a client sends, and apart from them
(``[db lua]``) the commands the scripts run inside Redis, which cost no round trip.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.support import ADMIN_TOKEN, GatewayFactory, forward, image_input

# Renewal far apart: a renewal landing during the counted requests would add a lease command of its own.
LEASES = {"ttl_s": 60.0, "renew_every_s": 50.0}
ON_THE_PATH = ("modgate:verdict", "modgate:engine-leases")
# The replicas' heartbeat (every pool refresh, whatever the traffic) is off the path, as a renewal is: a
# command whose only key is the registry is not a keyframe's.
HEARTBEAT_KEY = '"modgate:engine-leases:replicas"'


class RedisMonitor:
    """The commands clients send to a Redis while it runs (``MONITOR`` on a socket of its own)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        address = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._socket = socket.create_connection(address, timeout=10)
        self._socket.sendall(b"MONITOR\r\n")
        self._buffer = b""
        while b"\r\n" not in self._buffer:
            self._buffer += self._socket.recv(4096)
        assert self._buffer.startswith(b"+OK"), self._buffer
        self._buffer = self._buffer.split(b"\r\n", 1)[1]
        self._socket.settimeout(None)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while chunk := self._recv():
            self._buffer += chunk

    def _recv(self) -> bytes:
        try:
            return self._socket.recv(65536)
        except OSError:
            return b""

    def stop(self) -> list[str]:
        """Stop; the lines seen (``+<time> [<db> <client>] "COMMAND" "arg" ...``)."""
        # a last command of our own, so everything sent before it has reached the monitor's socket
        marker = redis.Redis(*self._socket.getpeername())
        marker.echo("monitor-end")
        marker.close()
        while b"monitor-end" not in self._buffer:
            self._reader.join(0.05)
        self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._reader.join(5)
        return [line.decode(errors="replace") for line in self._buffer.split(b"\r\n") if line]


@contextmanager
def monitored(url: str) -> Iterator[list[str]]:
    """The lines ``MONITOR`` saw inside the block (filled in when the block ends)."""
    monitor = RedisMonitor(url)
    seen: list[str] = []
    try:
        yield seen
    finally:
        seen.extend(monitor.stop())


def heartbeat(line: str) -> bool:
    """Whether a ``MONITOR`` line is the replicas' heartbeat: the registry is the one key it names."""
    return HEARTBEAT_KEY in line and line.count('"modgate:') == 1


def sent_on_the_path(lines: list[str]) -> list[str]:
    """The commands clients sent that name a verdict cache or engine lease key (not those scripts ran).

    A script's first use on a Redis is an ``EVALSHA`` refused with NOSCRIPT, a ``SCRIPT LOAD`` and the
    ``EVALSHA`` again (redis-py's ``Script``; once per script and server): counted once."""
    sent: list[tuple[str, str]] = []  # (client, command)
    for line in lines:
        if " lua]" in line:
            continue
        client, command = line.split("]", 1)[0].rsplit(" ", 1)[1], line.split('"')[1]
        if command == "SCRIPT" and sent and sent[-1] == (client, "EVALSHA"):
            sent.pop()
        elif any(key in line for key in ON_THE_PATH) and not heartbeat(line):
            sent.append((client, command))
    return [command for _, command in sent]


def moderate(gateway: ThreadedServer, frame: bytes) -> dict[str, Any]:
    response = httpx.post(
        f"{gateway.url}/v1/moderations", json={"model": "m", "input": image_input(frame)},
        headers={"X-Modgate-Thinking": "off"}, timeout=60,
    )
    assert response.status_code == 200, response.text
    details: dict[str, Any] = response.json()["results"][0]["modgate"]
    return details


FRAMES = [make_keyframe("allow", 1280, 720, seed=1000 + index) for index in range(4)]


def test_a_judged_keyframe_costs_two_redis_commands(
    redis_url: str, sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": redis_url}, leases=LEASES)
    moderate(gateway, FRAMES[0])  # scripts loaded, the policy seeded, the engine's model read
    with monitored(redis_url) as lines:
        judged = [moderate(gateway, frame) for frame in FRAMES[1:]]
    assert [details["reused"] for details in judged] == [None, None, None]
    # per keyframe: the lookup with the lease's acquire, the store with its release
    assert sent_on_the_path(lines) == ["EVALSHA"] * 6
    inside = [line.split('"')[1] for line in lines if " lua]" in line]
    stored = [line for line in lines if ' lua] "SET" "modgate:verdict:' in line]
    assert len(stored) == 3  # each verdict stored (the decision log's batch marker is a SET of its own)
    assert inside.count("ZREM") >= 3  # each lease given back (the fair acquire also ZREMs its waiter)


def test_a_reused_keyframe_costs_one_redis_command_and_no_lease(
    redis_url: str, sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": redis_url}, leases=LEASES)
    first = moderate(gateway, FRAMES[0])
    near = make_keyframe("allow", 1280, 720, seed=1000, quality=70)  # other bytes, the same picture
    with monitored(redis_url) as lines:
        again = moderate(gateway, FRAMES[0])
        similar = moderate(gateway, near)
    assert (again["reused"], similar["reused"]) == ("exact", "near")
    assert again["request_id"] == similar["request_id"] == first["request_id"]
    assert sent_on_the_path(lines) == ["EVALSHA", "EVALSHA"]
    inside = [line.split('"')[1] for line in lines if " lua]" in line]
    # no slot taken, no tenant registered as waiting for one, nothing charged to its fair share
    assert not {"ZADD", "ZINCRBY", "ZREM"} & set(inside)


def test_without_engine_leases_the_lookup_and_the_store_are_one_command_each(
    redis_url: str, sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, redis={"url": redis_url}, leases={**LEASES,
                                                                                       "enabled": False})
    moderate(gateway, FRAMES[0])
    with monitored(redis_url) as lines:
        judged = moderate(gateway, FRAMES[1])
        again = moderate(gateway, FRAMES[1])
    assert (judged["reused"], again["reused"]) == (None, "exact")
    assert sent_on_the_path(lines) == ["EVALSHA", "EVALSHA", "EVALSHA"]  # lookup, store; lookup


def test_a_keyframe_another_replica_judged_costs_this_replica_no_engine_call_not_even_a_tokenize(
    redis_url: str, sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    # The engine request is prepared before the lease is asked, its prompt measured with /tokenize the
    # first time; a fresh replica whose measurement is still to be made looks the frame up first instead.
    judged_by = start_gateway(engine={"url": sim.url}, redis={"url": redis_url}, leases=LEASES)
    first = moderate(judged_by, FRAMES[0])
    asked: list[str] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return await forward(request, sim.url)

    settings = Settings(auth={"admin_token": ADMIN_TOKEN}, engine={"url": sim.url},
                        redis={"url": redis_url}, leases=LEASES)
    with ThreadedServer(create_app(settings, engine_transport=httpx.MockTransport(engine))) as fresh:
        asked.clear()  # what the replica asked while starting (its model, its slots)
        again = moderate(fresh, FRAMES[0])
        assert again["reused"] == "exact"
        assert again["request_id"] == first["request_id"]
        assert not [path for path in asked if path in ("/tokenize", "/v1/chat/completions")]
        judged = moderate(fresh, FRAMES[1])  # a new frame: measured and judged as any other
    assert judged["reused"] is None
    assert "/tokenize" in asked
    assert "/v1/chat/completions" in asked
