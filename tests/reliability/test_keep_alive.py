"""An idle client connection outlives the pools of common clients, so a pooled request never lands on a
connection the server is closing ("Server disconnected without sending a response")."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx

from gateway.settings import Settings
from tests.processes import GatewayProcessFactory

UVICORN_DEFAULT_S = 5  # uvicorn's own timeout_keep_alive, the gateway's before: equal to httpx's pool expiry


def healthz_on(connection: socket.socket, host: str) -> bytes:
    """``GET /healthz`` on an open connection; what came back (empty if the server had closed it)."""
    connection.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
        try:
            chunk = connection.recv(4096)
        except ConnectionResetError:
            return reply
        if not chunk:
            return reply
        reply += chunk
    return reply


def still_served_after(url: str, idle_s: float) -> bool:
    """Whether a keep-alive connection left idle ``idle_s`` seconds still gets an answer."""
    address = urlsplit(url)
    assert address.hostname
    assert address.port
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        assert healthz_on(connection, address.netloc).startswith(b"HTTP/1.1 200")
        time.sleep(idle_s)
        return healthz_on(connection, address.netloc).startswith(b"HTTP/1.1 200")


def test_the_default_keep_alive_outlasts_the_pools_of_common_clients() -> None:
    # httpx keeps an idle connection 5 s, aiohttp 15 s, nginx's and AWS ALB's upstreams 60 s, Go's 90 s
    assert Settings().keep_alive_s > max(httpx.Limits().keepalive_expiry or 0, 15, 60, 90)


def test_a_connection_idle_past_uvicorns_default_is_still_served(
    gateway_process: GatewayProcessFactory,
) -> None:
    gateway = gateway_process()
    assert still_served_after(gateway.url, UVICORN_DEFAULT_S + 1)


def test_the_keep_alive_setting_reaches_the_server(gateway_process: GatewayProcessFactory) -> None:
    # the same wait, with the setting shorter than it: the server has closed the connection
    gateway = gateway_process(MODGATE_SERVER__KEEP_ALIVE_S="2")
    assert not still_served_after(gateway.url, 4)
