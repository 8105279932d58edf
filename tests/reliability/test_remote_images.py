"""Remote image URLs: off by default; when on, only allowlisted hosts, only public addresses (checked after
resolution and on every redirect, then connected to directly), with a size cap and a time cap."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.errors import ModgateError
from gateway.http.app import create_app
from gateway.http.providers import services_of
from gateway.moderation import remote_images
from gateway.moderation.remote_images import (
    RemoteImageFetcher,
    RemoteImageRefused,
    RemoteImageTooLarge,
    RemoteImageUnavailable,
    forbidden_address,
    host_allowed,
)
from gateway.settings import Settings
from tests.reliability.conftest import error_body
from tests.support import GatewayFactory

PUBLIC = "93.184.216.34"
FRAME = make_keyframe("block:violence", 320, 180, seed=5)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.8.8",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",  # noqa: S104 - an address to refuse, not to bind
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "100.64.0.1",
        "192.0.2.1",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:93.184.216.34",
        "2002:7f00:1::1",
        "2001:0:7f00:1::1",
        "64:ff9b::7f00:1",
        "2001:db8::1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert forbidden_address(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", [PUBLIC, "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert forbidden_address(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("cdn.example.com", True),
        ("CDN.Example.com.", True),
        ("img.example.org", True),
        ("a.b.example.org", True),
        ("example.org", False),
        ("evil-example.org", False),
        ("cdn.example.com.evil.net", False),
        ("example.com", False),
    ],
)
def test_the_allowlist_matches_exact_hosts_and_dotted_suffixes(host: str, allowed: bool) -> None:
    assert host_allowed(host, ["cdn.example.com", ".example.org"]) is allowed


class FakeDns:
    """Names → addresses, counting lookups."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        if host not in self.table:
            raise OSError("no such name")
        return self.table[host]


class Origin:
    """A fake origin server behind the transport: records what it was asked."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        result: httpx.Response = await self.handler(request)
        return result


def fetcher(dns: FakeDns, origin: Origin, **limits: Any) -> RemoteImageFetcher:
    options: dict[str, Any] = {"max_bytes": 1 << 20, "timeout_s": 2.0, "max_redirects": 3, **limits}
    return RemoteImageFetcher(
        ["cdn.example.com", ".example.org", "169.254.169.254"],
        resolve=dns,
        transport=httpx.MockTransport(origin),
        **options,
    )


async def serve_frame(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=FRAME, headers={"content-type": "image/jpeg"})


async def test_an_allowed_host_is_fetched_from_the_checked_address_by_name() -> None:
    dns, origin = FakeDns({"cdn.example.com": [PUBLIC]}), Origin(serve_frame)
    body = await fetcher(dns, origin).fetch("https://cdn.example.com:8443/frames/1.jpg?sig=abc")
    assert body == FRAME
    (request,) = origin.requests
    assert request.url.host == PUBLIC  # connected to the address that was checked: no second resolution
    assert request.headers["host"] == "cdn.example.com:8443"
    assert request.extensions["sni_hostname"] == "cdn.example.com"  # TLS still verifies the name
    assert request.url.path == "/frames/1.jpg"
    assert request.headers["accept-encoding"] == "identity"
    assert dns.lookups == ["cdn.example.com"]


async def refused(fetch: RemoteImageFetcher, url: str, kind: type[ModgateError] = RemoteImageRefused) -> str:
    with pytest.raises(kind) as caught:
        await fetch.fetch(url)
    return caught.value.message


async def test_a_host_off_the_allowlist_is_refused_without_a_lookup() -> None:
    dns, origin = FakeDns({}), Origin(serve_frame)
    assert "allowlist" in await refused(fetcher(dns, origin), "http://evil.example.net/x.jpg")
    assert dns.lookups == []
    assert origin.requests == []


async def test_an_allowed_name_that_resolves_to_a_private_address_is_refused() -> None:
    dns, origin = FakeDns({"cdn.example.com": ["10.0.0.7"]}), Origin(serve_frame)
    assert "private" in await refused(fetcher(dns, origin), "http://cdn.example.com/x.jpg")
    assert origin.requests == []


async def test_a_name_resolving_to_a_public_and_a_loopback_address_is_refused() -> None:
    dns, origin = FakeDns({"cdn.example.com": [PUBLIC, "127.0.0.1"]}), Origin(serve_frame)
    await refused(fetcher(dns, origin), "http://cdn.example.com/x.jpg")
    assert origin.requests == []


async def test_an_allowlisted_metadata_address_is_still_refused() -> None:
    origin = Origin(serve_frame)
    assert "resolves to a" in await refused(
        fetcher(FakeDns({}), origin), "http://169.254.169.254/latest/meta-data"
    )
    assert origin.requests == []


@pytest.mark.parametrize(
    "url",
    [
        "ftp://cdn.example.com/x.jpg",
        "http://user:secret@cdn.example.com/x.jpg",
        "file:///etc/passwd",
        "http://[::1]/x.jpg",
        "http://cdn.example.com\\@evil.net/",
    ],
)
async def test_urls_that_are_not_plain_http_to_an_allowed_host_are_refused(url: str) -> None:
    origin = Origin(serve_frame)
    await refused(fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), origin), url)
    assert origin.requests == []


async def test_a_redirect_to_a_private_address_is_refused_at_that_hop() -> None:
    async def redirect(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"location": "http://img.example.org/internal.jpg"})

    dns = FakeDns({"cdn.example.com": [PUBLIC], "img.example.org": ["192.168.0.10"]})
    origin = Origin(redirect)
    assert "private" in await refused(fetcher(dns, origin), "http://cdn.example.com/x.jpg")
    assert len(origin.requests) == 1
    assert dns.lookups == ["cdn.example.com", "img.example.org"]


async def test_a_redirect_off_the_allowlist_is_refused() -> None:
    async def redirect(request: httpx.Request) -> httpx.Response:
        return httpx.Response(301, headers={"location": "https://attacker.net/x.jpg"})

    origin = Origin(redirect)
    await refused(fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), origin), "http://cdn.example.com/x.jpg")


async def test_a_relative_redirect_to_an_allowed_place_is_followed() -> None:
    async def moved(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/old.jpg":
            return httpx.Response(307, headers={"location": "/new.jpg"})
        return await serve_frame(request)

    origin = Origin(moved)
    assert await fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), origin).fetch(
        "http://cdn.example.com/old.jpg"
    )
    assert [r.url.path for r in origin.requests] == ["/old.jpg", "/new.jpg"]


async def test_too_many_redirects_give_up() -> None:
    async def loop(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"location": "/again"})

    origin = Origin(loop)
    message = await refused(
        fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), origin, max_redirects=2),
        "http://cdn.example.com/x.jpg",
        RemoteImageUnavailable,
    )
    assert "redirected more than 2" in message
    assert len(origin.requests) == 3


async def test_a_body_over_the_cap_is_dropped_while_streaming() -> None:
    async def endless(request: httpx.Request) -> httpx.Response:
        async def chunks() -> Any:
            while True:
                yield b"\xff" * 65536

        return httpx.Response(200, content=chunks())

    origin = Origin(endless)
    await refused(
        fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), origin, max_bytes=200_000),
        "http://cdn.example.com/x.jpg",
        RemoteImageTooLarge,
    )


async def test_a_declared_length_over_the_cap_is_refused_before_reading() -> None:
    async def big(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"x" * 300_000)

    await refused(
        fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), Origin(big), max_bytes=200_000),
        "http://cdn.example.com/x.jpg",
        RemoteImageTooLarge,
    )


async def test_a_compressed_body_is_refused() -> None:
    async def gzipped(request: httpx.Request) -> httpx.Response:
        async def body() -> Any:
            yield b"\x1f\x8b\x08\x00"  # streamed, as a real origin's body is: nothing decoded it yet

        return httpx.Response(200, content=body(), headers={"content-encoding": "gzip"})

    await refused(
        fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), Origin(gzipped)),
        "http://cdn.example.com/x.jpg",
        RemoteImageUnavailable,
    )


async def test_a_slow_origin_hits_the_time_cap() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    message = await refused(
        fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), Origin(slow), timeout_s=0.3),
        "http://cdn.example.com/x.jpg",
        RemoteImageUnavailable,
    )
    assert "longer than 0.3 s" in message


async def test_an_error_status_is_unavailable() -> None:
    async def missing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    await refused(
        fetcher(FakeDns({"cdn.example.com": [PUBLIC]}), Origin(missing)),
        "http://cdn.example.com/x.jpg",
        RemoteImageUnavailable,
    )


# --- through the gateway -------------------------------------------------------------------------------


@dataclass
class LocalOrigin:
    """A real HTTP server on loopback that answers every GET with the keyframe."""

    port: int
    hosts: list[str]  # the Host header of each request, in order


@pytest.fixture
def local_origin() -> Iterator[LocalOrigin]:
    """A real HTTP server on loopback serving the keyframe at any path; stopped after the test."""
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hosts.append(self.headers["host"])
            self.send_response(200)
            self.send_header("content-type", "image/jpeg")
            self.send_header("content-length", str(len(FRAME)))
            self.end_headers()
            self.wfile.write(FRAME)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield LocalOrigin(server.server_address[1], hosts)
    server.shutdown()
    server.server_close()


def image_url_body(url: str) -> dict[str, Any]:
    return {"input": [{"type": "image_url", "image_url": {"url": url}}]}


async def test_the_gateway_refuses_an_allowlisted_name_that_resolves_to_loopback(
    start_gateway: GatewayFactory, sim: ThreadedServer, local_origin: LocalOrigin
) -> None:
    gateway = start_gateway(engine={"url": sim.url}, remote_images={"enabled": True,
                                                                    "allowlist": ["localhost"]})
    url = f"http://localhost:{local_origin.port}/frame.jpg"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        response = await client.post("/v1/moderations", json=image_url_body(url))
    assert response.status_code == 403  # listed in the document: a URL it allows is never a 400
    error = error_body(response)
    assert error["code"] == "remote_image_refused"
    assert "loopback" in error["message"]


async def test_the_gateway_moderates_a_fetched_image(sim: ThreadedServer) -> None:
    settings = Settings(engine={"url": sim.url}, remote_images={"enabled": True,
                                                                "allowlist": ["cdn.example.com"]})
    app = create_app(settings)
    async with AsyncTestClient(app, timeout=30) as client:
        # The network is faked (a public address, an origin in memory); the gateway path is real.
        services_of(app).moderation.remote_images = fetcher(
            FakeDns({"cdn.example.com": [PUBLIC]}), Origin(serve_frame)
        )
        response = await client.post("/v1/moderations", json=image_url_body("https://cdn.example.com/f.jpg"))
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["modgate"]["action"] == "block"


async def test_over_a_real_socket_the_fetcher_dials_the_address_and_names_the_host(
    monkeypatch: pytest.MonkeyPatch, local_origin: LocalOrigin
) -> None:
    port = local_origin.port
    # Loopback stands in for a public origin here: only this test lets the address through.
    monkeypatch.setattr(remote_images, "forbidden_address", lambda address: None)
    fetch = RemoteImageFetcher(
        ["cdn.example.com"],
        max_bytes=1 << 20,
        timeout_s=5,
        max_redirects=0,
        resolve=FakeDns({"cdn.example.com": ["127.0.0.1"]}),
    )
    try:
        assert await fetch.fetch(f"http://cdn.example.com:{port}/f.jpg") == FRAME
    finally:
        await fetch.aclose()
    assert local_origin.hosts == [f"cdn.example.com:{port}"]
