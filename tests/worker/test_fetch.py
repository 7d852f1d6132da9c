"""shared/fetch.py on its own: which addresses are inside, how listed hosts read, where
each kind of media may come from by default, and the address check at connection time against a
real server on a loopback port (refused unless the configuration names that host).
End to end through a worker turn: tests/delivery/test_media_hosts.py,
tests/chatwoot/test_media_hosts.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from shared.fetch import (
    MediaFetcher,
    MediaHosts,
    Origin,
    Refused,
    is_inside,
    listed_origin,
    origin_of,
)
from shared.settings import ConfigError, Settings
from tests.support.inside_host import PNG, RecordingHost, recording_host


@pytest.fixture
async def inside() -> AsyncIterator[RecordingHost]:
    async with recording_host("inside") as host:
        yield host


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # shared address space (carrier NAT, some platforms' insides)
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fe80::1%eth0",
        "fc00::1",
        "::ffff:127.0.0.1",  # IPv4 inside IPv6
        "::",
        "not-an-address",
    ],
)
def test_addresses_inside_are_refused(address: str) -> None:
    assert is_inside(address)


@pytest.mark.parametrize("address", ["157.240.22.35", "8.8.8.8", "2a03:2880:f10c:83:face:b00c::1"])
def test_public_addresses_are_not_inside(address: str) -> None:
    assert not is_inside(address)


def test_a_listed_host_without_a_scheme_is_https() -> None:
    assert listed_origin("cdn.example.com") == Origin("https", "cdn.example.com", 443)
    assert listed_origin("CDN.example.com:8443") == Origin("https", "cdn.example.com", 8443)
    assert listed_origin("http://127.0.0.1:8080") == Origin("http", "127.0.0.1", 8080)
    assert origin_of("ftp://example.com/x") is None
    assert origin_of("/relative") is None


@pytest.mark.parametrize(
    "entry", ["https://cdn.example.com/path", "ftp://x", "user@host", "host:99999", "https://"]
)
def test_a_listed_host_that_is_not_one_stops_start_up(entry: str) -> None:
    for variable in ("WHATSAPP_MEDIA_HOSTS", "CHATWOOT_MEDIA_HOSTS"):
        with pytest.raises(ConfigError, match=variable):
            Settings.from_env({variable: entry})


def test_by_default_media_comes_over_https_from_meta_and_chatwoot_only() -> None:
    hosts = MediaHosts.of(Settings.from_env({}))
    assert hosts.whatsapp == {
        Origin("https", "graph.facebook.com", 443),
        Origin("https", "lookaside.fbsbx.com", 443),
    }
    assert hosts.chatwoot == {Origin("https", "app.chatwoot.com", 443)}
    # The url of a media-id answer: https only while the Graph API is reached over https.
    assert Origin("https", "x.fbcdn.net", 443) in hosts.for_download("https://x.fbcdn.net/a")
    assert Origin("http", "x.fbcdn.net", 80) not in hosts.for_download("http://x.fbcdn.net/a")


async def test_a_host_that_resolves_inside_is_refused_at_connection_unless_configured(
    inside: RecordingHost,
) -> None:
    by_name = inside.url.replace("127.0.0.1", "localhost")
    everywhere = frozenset(filter(None, (origin_of(inside.url), origin_of(by_name))))
    unconfigured = MediaFetcher(MediaHosts.of(Settings.from_env({})), 5.0)
    try:
        for url in (f"{inside.url}/a.png", f"{by_name}/a.png"):
            with pytest.raises(httpx.ConnectError, match="an address inside: refused"):
                await unconfigured.get(url, allowed=everywhere, limit=1000)
        with pytest.raises(Refused):  # not an origin the fetch allows: not even resolved
            await unconfigured.get(f"{inside.url}/a.png", allowed=frozenset(), limit=1000)
    finally:
        await unconfigured.aclose()
    assert inside.calls == []

    configured = MediaFetcher(MediaHosts.of(Settings.from_env({"CHATWOOT_BASE_URL": by_name})), 5.0)
    try:
        got = await configured.get(f"{by_name}/a.png", allowed=everywhere, limit=1000)
    finally:
        await configured.aclose()
    assert got.body == PNG and len(inside.calls) == 1
