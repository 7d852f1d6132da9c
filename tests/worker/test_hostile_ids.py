"""Ids the receiver no longer takes, still reaching the scripts (events queued before the ids
were checked, or written by other tools): the intake reads them by decoding, never by
matching them in the JSON text (issue 21, finding 3), and the senders refuse to put them in a
URL.

Once, `ab"one` and `ab"two` were both matched as `ab\\` (the text up to the escaped quote): one
conversation, and the reply went to `ab\\`.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn
from shared.conversation.batch import Batch, Message
from shared.conversation.errors import NeedsReview
from shared.conversation.turn_state import Delivery, TurnState
from shared.keys import Keys
from shared.senders.whatsapp import WhatsAppSender
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.support.helpers import TOKEN
from tests.worker.support import TENANT, push_message, push_status
from worker.conversation_store import ConversationStore


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    s = settings.with_overrides(key_prefix=prefix, debounce_window_s=0.05, max_wait_s=0.1)
    scripts = Scripts()
    return ConversationStore(s, scripts, GroupCommitter(redis, scripts))


async def _claim_all(store: ConversationStore) -> list[Batch]:
    await store.claim(TENANT, 0, "t")  # intake only
    await asyncio.sleep(0.15)  # past the debounce
    return (await store.claim(TENANT, 10, "t")).batches


@pytest.mark.parametrize("ids", [('ab"one', 'ab"two'), ("ab\\", 'ab\\"'), ("x\\u0022", 'x"')])
async def test_two_persons_with_escapes_stay_two_conversations(
    redis: Redis, prefix: str, store: ConversationStore, ids: tuple[str, str]
) -> None:
    first, second = ids
    await push_message(redis, prefix, first, "wamid.A", "soy uno")
    await push_message(redis, prefix, second, "wamid.B", "soy dos")
    batches = await _claim_all(store)
    assert sorted((b.person, [m.text for m in b.messages]) for b in batches) == sorted(
        [(first, ["soy uno"]), (second, ["soy dos"])]
    )


async def test_a_status_id_with_an_escaped_quote_moves_no_other_record(
    redis: Redis, prefix: str, store: ConversationStore
) -> None:
    """A status for `wamid.X"Y` was once applied to the record of `wamid.X\\`."""
    k = Keys(prefix).tenant(TENANT)
    other = k.outbound("wamid.X\\")
    await redis.hset(other, mapping={"batch": "b1", "person": "1", "part": 0, "status": "sent"})
    await push_status(redis, prefix, "5491155550001", 'wamid.X"Y', "read")
    await store.claim(TENANT, 0, "t")
    assert await redis.hget(other, "status") == b"sent"
    assert await redis.hget(k.outbound('wamid.X"Y'), "early") == b"read"


@pytest.mark.parametrize("tenant", ["../../me", "cw-1-3", "106/../../me"])
async def test_the_whatsapp_sender_never_puts_a_tenant_that_is_not_digits_in_a_url(
    graph: GraphApiStandIn, tenant: str
) -> None:
    """`../../me` made the send URL `https://graph.facebook.com/me/messages`, with the token:
    the sender refuses it (to review) and the Graph API sees no request at all."""
    settings = Settings(whatsapp_api_base_url=graph.url, whatsapp_access_token=TOKEN)
    sender = WhatsAppSender(settings)  # its own client, as a worker builds it
    message = Message(id="wamid.A", type="text", text="hola", ts=0, channel="whatsapp")
    batch = Batch(
        tenant=tenant,
        person="5491155550001",
        id="b-1",
        token="t",
        attempt=0,
        claimed_ms=0,
        due_ms=0,
        requeued=False,
        messages=[message],
    )
    try:
        with pytest.raises(NeedsReview, match="not a phone_number_id"):
            await sender.send(batch, "hola", 0, delivery=Delivery(TurnState()))
        await sender.keep_typing(batch)  # best effort: refused the same way, and logged
    finally:
        await sender.aclose()
    assert graph.requests == []
