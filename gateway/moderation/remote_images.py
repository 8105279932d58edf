"""Opt-in fetching of ``http(s)`` keyframe URLs, without letting a caller reach what the gateway can reach.

A URL the caller sends makes the gateway open a connection; unchecked, that is a door into the gateway's
network (server-side request forgery). So, for every hop (the first URL and each redirect):

1. the scheme is ``http`` or ``https``, the URL has no user or password, and the host is on the operator's
   allowlist (``cdn.example.com`` exactly, ``.example.com`` for its subdomains);
2. the host is resolved once, and every address it resolves to must be a public one: private, loopback,
   link-local, multicast, reserved, unspecified, shared (CGNAT), IPv4-mapped or IPv4-tunnelled IPv6 are
   all refused, because a name can resolve to several and the connection may pick any of them;
3. the connection goes to the checked address itself (``Host`` header and TLS server name carry the
   name): the name is never resolved a second time, so a DNS answer that changes between check and
   connect (DNS rebinding) gains nothing;
4. redirects are followed by hand, at most ``max_redirects``, each one checked as a new URL;
5. the body is read as a stream and dropped past ``max_bytes``; compressed bodies are refused (no
   decompression bomb), and the whole fetch (DNS, connects, redirects, body) has one time limit.

No proxy from the environment applies and no cookie is kept: the transport is used directly.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import httpx

from gateway.errors import Forbidden, InvalidRequest, PayloadTooLarge, UnprocessableImage

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port)`` → the addresses the name resolves to."""

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_ADDRESS_CHECKS: Final = (
    ("is_loopback", "a loopback address"),
    ("is_private", "a private address"),
    ("is_link_local", "a link-local address"),
    ("is_multicast", "a multicast address"),
    ("is_reserved", "a reserved address"),
    ("is_unspecified", "the unspecified address"),
)


class RemoteImageRefused(Forbidden):
    """The URL may not be fetched: not allowed by the operator, or it leads somewhere private (403: a URL
    the API document allows may still be one this gateway's operator does not, so never a 400)."""

    default_code = "remote_image_refused"


class RemoteImageMalformed(InvalidRequest):
    """The URL is no URL (the API document's pattern excludes it): a 400."""

    default_code = "remote_image_malformed"


class RemoteImageUnavailable(UnprocessableImage):
    """The URL was allowed, but no image could be fetched from it."""

    default_code = "remote_image_unavailable"


class RemoteImageTooLarge(PayloadTooLarge):
    """The remote image is larger than the fetch limit."""

    default_code = "remote_image_too_large"


def is_remote_url(url: str) -> bool:
    """An ``http://`` or ``https://`` URL (anything else is left to the ``data:`` URL decoder)."""
    return url[:8].lower().startswith(("http://", "https://"))


def host_allowed(host: str, allowlist: Sequence[str]) -> bool:
    """``host`` is an entry of ``allowlist``, or a subdomain of an entry written with a leading dot."""
    host = host.lower().rstrip(".")
    for entry in allowlist:
        entry = entry.lower().rstrip(".")
        if entry.startswith("."):
            if host.endswith(entry) and len(host) > len(entry):
                return True
        elif host == entry:
            return True
    return False


def forbidden_address(address: IPAddress) -> str | None:
    """Why the gateway must not connect to ``address``, or None for a public address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return "an IPv4-mapped IPv6 address"
        if address.sixtofour is not None or address.teredo is not None:
            return "an IPv6 address tunnelling IPv4"
    for check, words in _ADDRESS_CHECKS:
        if getattr(address, check):
            return words
    if not address.is_global:
        return "an address that is not globally routable"
    return None


async def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system resolver, off the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class Fetched:
    """What a fetcher fetches, for its errors' words and its request: images for ``input``, or videos."""

    noun: str  # "image" or "video": "the image URL answered HTTP 404"
    param: str  # the request field its errors name
    accept: str  # the Accept header it sends


IMAGES: Final = Fetched("image", "input", "image/jpeg, image/png, image/webp")
VIDEOS: Final = Fetched("video", "video.url", "video/*")


class RemoteImageFetcher:
    """Fetches allowlisted image URLs (or, as ``what=VIDEOS``, video URLs), checking every address it is
    about to connect to."""

    def __init__(
        self,
        allowlist: Sequence[str],
        *,
        max_bytes: int,
        timeout_s: float,
        max_redirects: int,
        resolve: Resolver = resolve_host,
        transport: httpx.AsyncBaseTransport | None = None,
        what: Fetched = IMAGES,
    ) -> None:
        self.what = what
        self.noun = what.noun
        self.allowlist = tuple(allowlist)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_redirects = max_redirects
        self._resolve = resolve
        # The bare transport: no environment proxies, no cookie jar, no automatic redirects.
        self._transport = transport or httpx.AsyncHTTPTransport(retries=0)

    def _refused(self, message: str) -> RemoteImageRefused:
        return RemoteImageRefused(message, param=self.what.param)

    def _unavailable(self, message: str) -> RemoteImageUnavailable:
        return RemoteImageUnavailable(message, param=self.what.param)

    def _too_large(self, message: str) -> RemoteImageTooLarge:
        return RemoteImageTooLarge(message, param=self.what.param)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._transport.aclose()

    async def fetch(self, url: str) -> bytes:
        """The bytes at ``url``; a :class:`~gateway.errors.ClientError` when refused or unavailable."""
        body = bytearray()

        async def keep(chunk: bytes) -> None:
            body.extend(chunk)

        await self.fetch_into(url, keep)
        return bytes(body)

    async def fetch_into(self, url: str, write: Callable[[bytes], Awaitable[None]]) -> None:
        """The bytes at ``url`` handed to ``write`` as they stream in (a video's, to its file: never whole in
        memory); a :class:`~gateway.errors.ClientError` when refused or unavailable."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._follow(url, write)
        except TimeoutError as exc:
            took = f"fetching the {self.noun} took longer than {self.timeout_s:g} s"
            raise self._unavailable(took) from exc

    async def _follow(self, url: str, write: Callable[[bytes], Awaitable[None]]) -> None:
        current = self.check_url(url)
        for _ in range(self.max_redirects + 1):
            address = await self._checked_address(current)
            response = await self._get(current, address)
            try:
                if response.status_code in _REDIRECTS:
                    location = response.headers.get("location")
                    if not location:
                        raise self._unavailable(f"the {self.noun} URL redirected nowhere")
                    current = self.check_url(str(current.join(location)))
                    continue
                if response.status_code != 200:
                    raise self._unavailable(f"the {self.noun} URL answered HTTP {response.status_code}")
                await self._read_capped(response, write)
                return
            finally:
                await response.aclose()
        raise self._unavailable(f"the {self.noun} URL redirected more than {self.max_redirects} times")

    def check_url(self, url: str) -> httpx.URL:
        """The parsed URL if its scheme and host may be fetched (addresses are checked when fetching)."""
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise RemoteImageMalformed(f"the {self.noun} URL is not a valid URL",
                                       param=self.what.param) from exc
        if parsed.scheme not in ("http", "https"):
            raise self._refused(f"only http and https {self.noun} URLs are fetched, not {parsed.scheme!r}")
        if parsed.userinfo:
            raise self._refused(f"{self.noun} URLs with a user name or password are refused")
        host = parsed.raw_host.decode("ascii", "replace")  # IDNA (punycode) form, as the allowlist is written
        if not host or not host_allowed(host, self.allowlist):
            raise self._refused(f"the host {host[:100]!r} is not on the allowlist "
                                "(MODGATE_REMOTE_IMAGES__ALLOWLIST)")
        return parsed

    async def _checked_address(self, url: httpx.URL) -> str:
        """The address to connect to, once every address of the host has been found public."""
        host = url.raw_host.decode("ascii")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                resolved = await self._resolve(host, port)
            except OSError as exc:
                raise self._unavailable(f"the {self.noun} host {host!r} does not resolve") from exc
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolved]
        if not addresses:
            raise self._unavailable(f"the {self.noun} host {host!r} has no address")
        for address in addresses:
            why = forbidden_address(address)
            if why is not None:
                raise self._refused(f"the {self.noun} host {host!r} resolves to {why}; refused")
        return str(addresses[0])

    async def _get(self, url: httpx.URL, address: str) -> httpx.Response:
        host = url.raw_host.decode("ascii")
        request = httpx.Request(
            "GET",
            url.copy_with(host=address),
            headers={
                "Host": url.netloc.decode("ascii"),
                "Accept": self.what.accept,
                "Accept-Encoding": "identity",
                "User-Agent": f"modgate-{self.noun}-fetcher",
            },
            extensions={
                "sni_hostname": host,  # TLS is verified against the name, though we dial the address
                "timeout": {
                    "connect": self.timeout_s,
                    "read": self.timeout_s,
                    "write": self.timeout_s,
                    "pool": self.timeout_s,
                },
            },
        )
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.TransportError as exc:
            failed = f"the {self.noun} URL could not be fetched ({type(exc).__name__})"
            raise self._unavailable(failed) from exc
        response.request = request
        return response

    async def _read_capped(self, response: httpx.Response, write: Callable[[bytes], Awaitable[None]]) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise self._unavailable(f"the {self.noun} was sent {encoding}-compressed; refused")
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise self._too_large(f"the remote {self.noun} is {int(declared):,} bytes, over the "
                f"{self.max_bytes:,}-byte limit")
        size = 0
        try:
            async for chunk in response.aiter_bytes():  # identity only (checked above): the raw bytes
                size += len(chunk)
                if size > self.max_bytes:
                    raise self._too_large(f"the remote {self.noun} is over the {self.max_bytes:,}-byte limit")
                await write(chunk)
        except httpx.TransportError as exc:
            raise self._unavailable(f"the {self.noun} download broke off ({type(exc).__name__})") from exc
