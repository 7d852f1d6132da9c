"""A reply by hand in a Chatwoot conversation (worker/manual_reply.py): it goes out through the
real Chatwoot sender to the API stand-in, with no 24-hour window of ours (Chatwoot's channel
keeps its own), and enters the memory like a WhatsApp one (tests/delivery/test_manual_reply.py
covers the rest)."""

from __future__ import annotations

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import ChatwootApiStandIn
from shared.keys import Keys
from shared.ops.manual_reply import ManualReplies, ManualReplyError
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.chatwoot.support import CONVERSATION, TENANT
from tests.worker.support import push_message
from worker.conversation_store import ConversationStore

PERSON = str(CONVERSATION)
TEXT = "Hola, soy Ana: ya reviso su pedido."


async def test_a_reply_by_hand_goes_out_through_chatwoot(
    redis: Redis, prefix: str, env: dict[str, str], chatwoot: ChatwootApiStandIn
) -> None:
    settings = Settings.from_env(env)
    await push_message(
        redis, prefix, PERSON, "cw:501", "hola", tenant=TENANT, wake=False, channel="chatwoot"
    )
    store = ConversationStore(settings, Scripts(), GroupCommitter(redis, Scripts()))
    await store.claim(TENANT, 0, "test")  # the intake: the message waits in `pending`
    replies = ManualReplies(redis, Keys(prefix), Scripts(), settings)
    try:
        result = await replies.reply(TENANT, PERSON, TEXT, by="ana")

        (reply,) = chatwoot.replies(CONVERSATION)
        assert reply.content == TEXT and reply.account == 1
        assert result.provider_ids == [str(reply.id)]
        assert not result.template and result.answered == 1
        k = Keys(prefix).tenant(TENANT)
        (remembered,) = [orjson.loads(m) for m in await redis.lrange(k.memory(PERSON), 0, -1)]
        assert remembered["by"] == "human" and remembered["assistant"] == TEXT
        assert await redis.exists(k.pending(PERSON), k.lock(PERSON)) == 0

        chatwoot.fail_next(1, status=404)
        with pytest.raises(ManualReplyError, match=r"refused the reply \(not_found\)"):
            await replies.reply(TENANT, PERSON, "otra", by="ana")
        assert len(chatwoot.replies(CONVERSATION)) == 1
        assert await redis.llen(k.memory(PERSON)) == 1, "nothing remembered of the refused one"
    finally:
        await replies.aclose()
