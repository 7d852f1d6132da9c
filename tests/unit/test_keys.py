"""shared/keys.py's layout: one cluster slot per tenant, and conversation keys found by SCAN."""

from __future__ import annotations

import pytest
from fakeredis.aioredis import FakeRedis
from redis.crc import key_slot

from shared.keys import KeyError_, Keys

TENANT = "106540352242922"


def test_every_key_of_a_tenant_is_in_one_cluster_slot() -> None:
    k = Keys("wa").tenant(TENANT)
    person = "5491155550001"
    names = [k.inbox, k.seen("wamid.X"), k.due, k.running, k.burst, k.review, k.outbox]
    names += [k.stats, k.unroutable, k.outbound("wamid.Y"), k.pending(person), k.batch(person)]
    names += [k.lock(person), k.last_inbound(person), k.memory(person)]
    names += [k.seen_book, k.outbound_book, k.outbound_gens]
    assert {key_slot(name.encode()) for name in names} == {key_slot(TENANT.encode())}


def test_an_id_that_would_break_the_hash_tag_is_refused() -> None:
    for tenant in ("", "a{b", "a}b"):
        with pytest.raises(KeyError_):
            Keys().tenant(tenant)
    with pytest.raises(KeyError_):
        Keys().tenant(TENANT).pending("x}y")


async def test_a_glob_character_in_the_prefix_is_matched_literally(fake: FakeRedis) -> None:
    odd = Keys("ls[1]*").tenant(TENANT)
    await fake.rpush(odd.pending("p1"), b"m")
    await fake.rpush(Keys("ls1x").tenant(TENANT).pending("p2"), b"m")  # what [1]* would match
    found = [
        odd.person_in(k.decode(), "pending")
        async for k in fake.scan_iter(match=odd.conversations_pattern("pending"))
    ]
    assert found == ["p1"]
