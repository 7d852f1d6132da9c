"""Outbound fetches of media that can neither leak a token nor reach inside.

Every file the worker downloads for the AI (worker/brains/media.py), and every file the ops page
shows (shared/ops/media.py), goes through `MediaFetcher`:
- a URL is fetched only when its origin (scheme, host, port) is one the fetch allows
  (`MediaHosts`): the Graph token goes only to the Graph API, the url its media-id answer gives,
  Meta's media host and `WHATSAPP_MEDIA_HOSTS`; Chatwoot attachments come only from
  `CHATWOOT_BASE_URL` and `CHATWOOT_MEDIA_HOSTS`. A listed host without a scheme is https.
- a redirect is followed only to an origin the same fetch allows (at most `MAX_REDIRECTS`), and
  the token is dropped when the origin changes (httpx builds the next request).
- every connection goes to an address checked first: the host is resolved once, each of its
  addresses must be public (not loopback, private, link-local, ...), and the socket is opened to
  the checked address, so a DNS answer that changes between the check and the connection (DNS
  rebinding) changes nothing. TLS still checks the certificate of the host's name. The hosts the
  configuration names (the base URLs, the listed hosts) are trusted as configured: dev and the
  tests run their stand-ins on 127.0.0.1, a proxy may live inside the network.
- the body is read up to a limit (`TooBig` past it), within the caller's time limit.

Environment proxies (`HTTPS_PROXY`) do not apply here: a proxy would resolve the names itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpcore
import httpx

from shared.settings import Settings

MAX_REDIRECTS = 5
# Where Meta's media-id answers point (`https://lookaside.fbsbx.com/whatsapp_business/...`).
META_MEDIA_HOSTS = ("https://lookaside.fbsbx.com",)
DEFAULT_PORTS = {"http": 80, "https": 443}


class Unfetchable(Exception):
    """The URL gave no file: an HTTP status other than 200, too many redirects."""


class Refused(Unfetchable):
    """A URL whose origin the fetch does not allow: nothing was sent there."""


class TooBig(Exception):
    """The file is larger than the limit."""


@dataclass(frozen=True)
class Origin:
    """Where a URL's requests go: scheme, host (as connected to) and port."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def origin_of(url: str | httpx.URL) -> Origin | None:
    """The origin of an http(s) URL; None for anything else or a URL that does not parse."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return None
    if parsed.scheme not in DEFAULT_PORTS or not parsed.raw_host:
        return None
    host = parsed.raw_host.decode("ascii").lower()
    return Origin(parsed.scheme, host, parsed.port or DEFAULT_PORTS[parsed.scheme])


def listed_origin(entry: str) -> Origin | None:
    """The origin of a listed host: `host`, `host:port` (https), `http(s)://host[:port]`."""
    return origin_of(entry if "://" in entry else f"https://{entry}")


def _origins(urls: Iterable[str]) -> frozenset[Origin]:
    return frozenset(o for o in map(listed_origin, urls) if o is not None)


@dataclass(frozen=True)
class MediaHosts:
    """Where each kind of media fetch may go, and which hosts the configuration names."""

    graph: Origin | None
    whatsapp: frozenset[Origin]  # may get the Graph token: Graph, Meta's media host, listed
    chatwoot: frozenset[Origin]  # attachments: CHATWOOT_BASE_URL's host and the listed ones
    configured: frozenset[Origin]  # connections there are not address-checked

    @classmethod
    def of(cls, settings: Settings) -> MediaHosts:
        graph = origin_of(settings.whatsapp_api_base_url)
        whatsapp_listed = _origins(settings.whatsapp_media_hosts)
        chatwoot = _origins((settings.chatwoot_base_url, *settings.chatwoot_media_hosts))
        bases = (settings.whatsapp_api_base_url, settings.transcribe_base_url)
        configured = _origins(b for b in bases if b) | whatsapp_listed | chatwoot
        meta = _origins(META_MEDIA_HOSTS)
        whatsapp = whatsapp_listed | meta | ({graph} if graph else set())
        return cls(graph, whatsapp, chatwoot, configured)

    def for_download(self, url: str) -> frozenset[Origin]:
        """Where the url of the Graph API's media-id answer may be fetched from with the token:
        it (https, or as the Graph API itself is reached in dev), and the WhatsApp hosts."""
        origin = origin_of(url)
        plain_graph = self.graph is not None and self.graph.scheme == "http"
        if origin is None or not (origin.scheme == "https" or plain_graph):
            return self.whatsapp
        return self.whatsapp | {origin}


@dataclass(frozen=True)
class Fetched:
    body: bytes
    content_type: str


class MediaFetcher:
    """One httpx client whose every connection is address-checked; `get` adds the origin check
    and the redirects."""

    def __init__(self, hosts: MediaHosts, timeout_s: float) -> None:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
        trusted = frozenset((o.host, o.port) for o in hosts.configured)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
            transport=CheckedTransport(trusted, limits),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def get(
        self,
        url: str,
        *,
        allowed: frozenset[Origin],
        limit: int,
        headers: Mapping[str, str] | None = None,
    ) -> Fetched:
        """The body of `url` (status 200, at most `limit` bytes), fetched from origins in
        `allowed` only, redirects included. Raises Refused, Unfetchable, TooBig, httpx.HTTPError
        (a refused address is an httpx.ConnectError)."""
        _check(url, allowed)
        request = self.client.build_request("GET", url, headers=headers)
        for _ in range(MAX_REDIRECTS + 1):
            response = await self.client.send(request, stream=True)
            try:
                if response.next_request is None:
                    return await _read(response, limit)
                request = response.next_request  # without the token for another origin
            finally:
                await response.aclose()
            _check(request.url, allowed)
        raise Unfetchable(f"more than {MAX_REDIRECTS} redirects")


def _check(url: str | httpx.URL, allowed: frozenset[Origin]) -> None:
    origin = origin_of(url)
    if origin is None or origin not in allowed:
        raise Refused(f"{origin or 'the url'} is not a host this media may come from")


async def _read(response: httpx.Response, limit: int) -> Fetched:
    if response.status_code != 200:
        raise Unfetchable(f"HTTP {response.status_code}")
    announced = response.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > limit:
        raise TooBig(announced)
    chunks, total = [], 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            raise TooBig(total)
        chunks.append(chunk)
    return Fetched(b"".join(chunks), response.headers.get("content-type", ""))


class CheckedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport, its connection pool opening sockets through `CheckedBackend`."""

    def __init__(self, trusted: frozenset[tuple[str, int]], limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        # httpx offers no way to name the pool's network backend: the same pool, with ours.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=CheckedBackend(trusted),
        )


class InsideAddress(httpcore.ConnectError):
    """The host resolves to an address inside (loopback, private, link-local, ...)."""


class CheckedBackend(httpcore.AsyncNetworkBackend):
    """Opens a TCP connection only to a checked address: the host is resolved once, every
    address must be public, and the socket goes to that address. `trusted` (host, port) pairs,
    the ones the configuration names, are connected to as they are."""

    def __init__(self, trusted: frozenset[tuple[str, int]]) -> None:
        self._trusted = trusted
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 -- httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if (host.lower(), port) in self._trusted:
            return await self._backend.connect_tcp(
                host, port, timeout, local_address, socket_options
            )
        addresses = await _resolve(host, port, timeout)
        inside = [a for a in addresses if is_inside(a)]
        if inside:
            raise InsideAddress(f"{host} resolves to {inside[0]}, an address inside: refused")
        error: Exception = httpcore.ConnectError(f"{host}: no address")
        for address in addresses:
            try:
                return await self._backend.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                error = exc
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 -- httpcore's interface
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("media is never fetched over a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


async def _resolve(host: str, port: int, within_s: float | None) -> list[str]:
    """The host's addresses, in the resolver's order, each once."""
    try:
        async with asyncio.timeout(within_s):
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
    except (OSError, TimeoutError) as exc:
        raise httpcore.ConnectError(f"{host}: {exc!r}") from exc
    return list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in found))


def is_inside(address: str) -> bool:
    """True for an address no media fetch may reach: loopback, private, link-local, shared
    (100.64/10), unspecified, multicast, reserved, documentation; IPv4 inside IPv6 included.
    Anything that is not an IP address is inside too."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast
