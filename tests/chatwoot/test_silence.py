"""The bot is silent in a Chatwoot conversation a person of the business handles, and the AI
later reads what was said meanwhile. End to end: signed webhooks into the real receiver, real
workers with the real Claude brain (the anthropic SDK against the Messages API stand-in), replies
and hand-overs through the real Chatwoot sender to the Chatwoot stand-in, which posts back what
Chatwoot posts: the bot's own messages, agents' messages and conversation events.

Each condition has its test: an agent writes, an agent is assigned, the bot hands over (the
AI's hand-over tool), and the ends of the silence: pending again, resolved, resolved and
reopened, a pending conversation's message where an agent bot hears of no status change. The
bot's own replies, sent with a user's token, are never taken for an agent's. A customer's
message while silent starts no turn: the intake puts it in the memory at once, so "no turn"
is checked on Redis (nothing pending, nothing due) and on the stand-ins (no AI call, no reply)
once the intake counted it, without sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from scripts.standins import ChatwootApiStandIn, MessagesApiStandIn
from scripts.webhooks import agent_user
from shared.conversation.human_memory import HEADER, SILENT_ANSWER
from shared.keys import Keys
from tests.chatwoot.support import CONVERSATION, TENANT, post_message
from tests.delivery.support import InProcessWorkers, ai_requests
from tests.support.helpers import API_KEY
from tests.worker.support import in_review, stats, wait_for
from worker.brains.tools import HAND_OVER_TOOL

LAURA = agent_user(12, "Laura Gómez")
AI = {
    "BRAIN": "anthropic",
    "ANTHROPIC_API_KEY": API_KEY,
    "AI_MODEL": "claude-test-model",
    "SYSTEM_PROMPT": "Sos el asistente de Turnos SRL.",
    "AI_TIMEOUT_S": "5",
}


@pytest.fixture(autouse=True)
def anthropic_env(ai: MessagesApiStandIn, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # In-process workers build their SDK client here: it reads these from the environment.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", ai.url)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield


class Conversation:
    """Conversation 42 as its people see it: the customer writes (with the conversation's
    status and assignee as Chatwoot has them), agents act in the stand-in."""

    def __init__(self, redis: Redis, prefix: str, url: str, chatwoot: ChatwootApiStandIn) -> None:
        self.redis, self.prefix, self.url, self.chatwoot = redis, prefix, url, chatwoot
        self._next_id = 9100

    async def customer(self, text: str) -> None:
        self._next_id += 1
        state = self.chatwoot.conversation_state(1, CONVERSATION)
        await post_message(self.url, self._next_id, text, **state)

    async def counted(self, name: str, at_least: int = 1) -> dict[str, int]:
        async def enough() -> dict[str, int] | None:
            s = await stats(self.redis, self.prefix, TENANT)
            return s if s.get(name, 0) >= at_least else None

        return await wait_for(enough, f"stats {name} >= {at_least}")

    async def replies(self, count: int) -> list[str]:
        await self.chatwoot.await_for(
            lambda: len(self.chatwoot.replies(CONVERSATION)) >= count, timeout=10
        )
        return [m.content for m in self.chatwoot.replies(CONVERSATION)]

    async def silent(self) -> dict[str, Any] | None:
        import orjson

        raw = await self.redis.get(Keys(self.prefix).tenant(TENANT).silent(str(CONVERSATION)))
        return orjson.loads(raw) if raw else None

    async def reviewed(self) -> list[dict[str, Any]]:
        return await in_review(self.redis, self.prefix, TENANT)

    async def nothing_waits(self) -> bool:
        k = Keys(self.prefix).tenant(TENANT)
        person = str(CONVERSATION)
        return (
            await self.redis.exists(k.pending(person), k.batch(person)) == 0
            and await self.redis.zscore(k.due, person) is None
        )


@pytest.fixture
def talk(
    redis: Redis, prefix: str, receiver_url: str, chatwoot: ChatwootApiStandIn
) -> Conversation:
    chatwoot.configure(conversation_events="account")
    return Conversation(redis, prefix, receiver_url, chatwoot)


def said_in(request: Any) -> list[tuple[str, list[str]]]:
    """A Messages API request's messages as (role, the text of each block)."""
    return [
        (m["role"], [b["text"] for b in m["content"] if b.get("type") == "text"])
        for m in request.body["messages"]
    ]


async def test_an_agent_who_writes_silences_the_bot_and_the_ai_later_reads_both_sides(
    talk: Conversation, workers: InProcessWorkers, ai: MessagesApiStandIn
) -> None:
    await workers.start(**AI)
    await talk.customer("hola, ¿tienen turno el sábado?")
    assert await talk.replies(1) == ["stand-in reply to: hola, ¿tienen turno el sábado?"]

    talk.chatwoot.agent_writes(CONVERSATION, "Hola Ana, soy Laura. Te confirmo el sábado a las 16.")
    await talk.counted("event:agent_message")
    assert (await talk.silent() or {})["why"] == "agent"
    await talk.customer("gracias Laura")
    await talk.counted("silent_messages")
    assert await talk.nothing_waits(), "the message started no turn"
    assert len(ai_requests(ai)) == 1 and len(talk.chatwoot.replies()) == 1

    # The agent takes the conversation, then gives it back to the bot.
    talk.chatwoot.set_status(CONVERSATION, "open")
    await talk.counted("silence:opened")
    talk.chatwoot.set_status(CONVERSATION, "pending")
    await talk.counted("speak:pending")
    await talk.customer("¿y el domingo?")
    assert (await talk.replies(2))[1] == "stand-in reply to: ¿y el domingo?"
    first, second = ai_requests(ai)
    history = said_in(second)
    assert history[:2] == [
        *said_in(first)[:1],
        ("assistant", ["stand-in reply to: hola, ¿tienen turno el sábado?"]),
    ]
    assert history[2] == (
        "user",
        [
            HEADER,
            "Laura Gómez, a person of the business (not you): Hola Ana, soy Laura. Te confirmo"
            " el sábado a las 16.\nThe customer (Ana Pérez): gracias Laura",
        ],
    )
    assert history[3] == ("assistant", [SILENT_ANSWER])
    assert history[4][0] == "user" and history[4][1][-1] == "¿y el domingo?"
    assert await talk.silent() is None


async def test_an_assigned_agent_silences_the_bot_until_the_conversation_is_pending_again(
    talk: Conversation, workers: InProcessWorkers, ai: MessagesApiStandIn
) -> None:
    # An account webhook's inbox without a bot: conversations are `open` from the start.
    talk.chatwoot.configure(conversation_events="")
    talk.chatwoot.set_status(CONVERSATION, "open")
    talk.chatwoot.configure(conversation_events="account")
    await workers.start(**AI)
    await talk.customer("hola")
    await talk.replies(1)

    talk.chatwoot.assign(CONVERSATION, 12, "Laura Gómez")
    await talk.counted("silence:assignee")
    assert (await talk.silent() or {})["by"] == "Laura Gómez"
    await talk.customer("¿me atiende alguien?")
    await talk.counted("silent_messages")
    assert await talk.nothing_waits()
    assert len(ai_requests(ai)) == 1

    talk.chatwoot.set_status(CONVERSATION, "pending")
    await talk.counted("speak:pending")
    # Still assigned, but back with the bot: it answers.
    await talk.customer("sigo acá")
    assert (await talk.replies(2))[1] == "stand-in reply to: sigo acá"
    history = said_in(ai_requests(ai)[1])
    assert history[2] == ("user", [HEADER, "The customer (Ana Pérez): ¿me atiende alguien?"])


async def test_after_the_bots_hand_over_it_is_silent_until_the_conversation_is_resolved(
    talk: Conversation, workers: InProcessWorkers, ai: MessagesApiStandIn, redis: Redis
) -> None:
    ai.queue_reply(
        [
            {"type": "text", "text": "Entiendo."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": HAND_OVER_TOOL,
                "input": {"reason": "reclamo"},
            },
        ]
    )
    await workers.start(**AI)
    await talk.customer("quiero hacer un reclamo")
    await talk.counted("silence:hand_over")
    (item,) = await talk.reviewed()
    assert item["reason"] == "ai_hand_over" and item["hand_over"] == "done"
    assert talk.chatwoot.status_of(CONVERSATION) == "open"
    assert (await talk.silent() or {})["why"] == "hand_over"

    await talk.customer("¿hola?")
    await talk.counted("silent_messages")
    assert await talk.nothing_waits() and len(ai_requests(ai)) == 1

    talk.chatwoot.set_status(CONVERSATION, "resolved")
    await talk.counted("speak:resolved")
    talk.chatwoot.set_status(CONVERSATION, "open")  # the customer's next message reopens it
    await talk.customer("otra consulta")
    replies = await talk.replies(2)  # the hand-over text, then the answer
    assert replies[-1] == "stand-in reply to: otra consulta"
    history = said_in(ai_requests(ai)[1])
    assert ("user", [HEADER, "The customer (Ana Pérez): ¿hola?"]) in history


async def test_reopening_a_resolved_conversation_ends_a_silence_begun_after_it_was_resolved(
    talk: Conversation, workers: InProcessWorkers, ai: MessagesApiStandIn
) -> None:
    await workers.start(**AI)
    talk.chatwoot.set_status(CONVERSATION, "resolved")
    await talk.chatwoot.await_webhooks()  # stored before what follows: taken in first
    # An agent's closing words in the resolved conversation: silent again.
    talk.chatwoot.agent_writes(CONVERSATION, "¡Gracias por escribirnos!")
    await talk.counted("event:agent_message")
    assert await talk.silent() is not None

    talk.chatwoot.set_status(CONVERSATION, "open")  # resolved -> open: reopened
    await talk.counted("speak:reopened")
    await talk.customer("una cosa más")
    assert await talk.replies(1) == ["stand-in reply to: una cosa más"]


async def test_with_an_agent_bot_a_message_of_a_pending_unassigned_conversation_ends_the_silence(
    talk: Conversation, workers: InProcessWorkers, ai: MessagesApiStandIn
) -> None:
    """An agent bot hears of `conversation_opened` and `conversation_resolved` only: that the
    conversation is with the bot again it learns from the customer's next message."""
    talk.chatwoot.configure(conversation_events="agent_bot")
    await workers.start(**AI)
    await talk.customer("hola")
    await talk.replies(1)
    talk.chatwoot.set_status(CONVERSATION, "open")  # an agent takes it: conversation_opened
    await talk.counted("silence:opened")
    await talk.customer("¿sigue ahí?")
    await talk.counted("silent_messages")
    assert len(ai_requests(ai)) == 1

    talk.chatwoot.set_status(CONVERSATION, "pending")  # back to the bot: no event for a bot
    # Chatwoot's times are whole seconds here: a message of the second the conversation was
    # opened may be older than the opening, so it keeps the silence. The next second's ends it.
    await asyncio.sleep(1.1)
    await talk.customer("¿me ayudás con otra cosa?")
    assert (await talk.replies(2))[1] == "stand-in reply to: ¿me ayudás con otra cosa?"
    assert (await talk.counted("speak:pending"))["silent_messages"] == 1


async def test_the_bots_own_replies_sent_with_a_users_token_are_not_an_agents(
    talk: Conversation, workers: InProcessWorkers, ai: MessagesApiStandIn
) -> None:
    # The product posts with a user's token: Chatwoot says a user wrote its replies.
    talk.chatwoot.configure(bot_sender=agent_user(5, "Cuenta API"))
    await workers.start(**AI)
    await talk.customer("hola")
    await talk.replies(1)
    counts = await talk.counted("event:own_reply")
    assert counts.get("event:agent_message", 0) == 0 and await talk.silent() is None
    await talk.customer("¿y mañana?")
    assert (await talk.replies(2))[1] == "stand-in reply to: ¿y mañana?"
    assert (await talk.counted("event:own_reply", 2)).get("silent_messages", 0) == 0


async def test_a_hand_over_chatwoot_refused_still_silences_the_bot(
    talk: Conversation, workers: InProcessWorkers, ai: MessagesApiStandIn, redis: Redis
) -> None:
    """The batch waits for a person on the review list: the bot does not answer meanwhile."""
    talk.chatwoot.fail_always(422, message="Conversation is locked", kinds=["reply"])
    talk.chatwoot.fail_always(403, kinds=["note", "status"])
    await workers.start(**AI)
    await talk.customer("hola")
    await talk.counted("silence:hand_over_unconfirmed")
    (item,) = await talk.reviewed()
    assert item["reason"] == "invalid_request" and item["hand_over"].startswith("failed: ")
    # The conversation is still pending in Chatwoot (its status change was refused): a message
    # in a later second, still "pending", must not give it back to the bot (it did whenever
    # the test crossed a second: a flake under load).
    await asyncio.sleep(1.1)
    await talk.customer("¿hola?")
    await talk.counted("silent_messages")
    assert await talk.nothing_waits() and len(ai_requests(ai)) == 1
