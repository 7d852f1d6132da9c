"""Loading brains and senders from BRAIN / SENDER: built-ins, `package.module:attr` (a plain
object as a sender answers real turns), and errors that name the variable (in-process, and a
worker process that refuses to start)."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from shared.conversation.batch import Batch, Message
from shared.keys import Keys
from shared.senders.base import Sender
from shared.senders.loading import OutboxSender, as_sender, load_sender, plugin_of
from shared.settings import ConfigError, Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.worker.brains import STATIC_BRAIN, RecordingBrain
from tests.worker.senders import LegacySender, sent_key
from tests.worker.support import TENANT, WorkerFleet, push_message, run_module, wait_for
from worker.brains.loading import EchoBrain, load_brain


def _batch(*texts: str) -> Batch:
    messages = [Message(id=f"m{i}", type="text", text=t, ts=0) for i, t in enumerate(texts)]
    return Batch("t", "p", "b1", "tok", 0, 0, 0, False, messages)


async def test_echo_brain_shows_the_whole_batch() -> None:
    brain = load_brain(Settings(brain="echo"))
    assert isinstance(brain, EchoBrain)
    assert (
        await brain.reply(_batch("hola", "una consulta")) == "Got 2 messages: hola / una consulta"
    )
    assert await brain.reply(_batch("hola")) == "Got 1 message: hola"


def test_a_class_gets_the_settings_and_an_object_is_used_as_is() -> None:
    settings = Settings(brain="tests.worker.brains:RecordingBrain")
    assert isinstance(load_brain(settings), RecordingBrain)
    assert load_brain(Settings(brain="tests.worker.brains:STATIC_BRAIN")) is STATIC_BRAIN


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "BRAIN must be a built-in name or 'package.module:attr'"),
        ("tests.worker.brains:", "BRAIN must be a built-in name"),
        (":RecordingBrain", "BRAIN must be a built-in name"),
        ("no_such_module_xyz:Brain", "BRAIN='no_such_module_xyz:Brain' cannot be loaded"),
        ("tests.worker.brains:Missing", "BRAIN='tests.worker.brains:Missing' cannot be loaded"),
        ("tests.worker.brains:NotABrain", "has no reply() method"),
        ("tests.worker.brains:NOT_CALLABLE", "BRAIN='tests.worker.brains:NOT_CALLABLE'"),
        ("tests.worker.brains:NoArgsBrain", "BRAIN='tests.worker.brains:NoArgsBrain'"),
    ],
)
def test_bad_brains_are_config_errors_naming_brain(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_brain(Settings(brain=spec))
    assert message in str(caught.value)


def test_senders_load_like_brains_and_name_sender() -> None:
    scripts = Scripts()
    committer = GroupCommitter(None, scripts)
    assert isinstance(load_sender(Settings(), Keys(), committer), OutboxSender)
    with pytest.raises(ConfigError, match="SENDER must be a built-in name"):
        load_sender(Settings(sender="smtp"), Keys(), committer)
    with pytest.raises(ConfigError, match=r"SENDER=.* has no send\(\) method"):
        load_sender(Settings(sender="tests.worker.brains:RecordingBrain"), Keys(), committer)
    with pytest.raises(ConfigError, match=r"SENDER=.* cannot be loaded"):
        load_sender(Settings(sender="tests.worker.nope:Sender"), Keys(), committer)


def test_a_plain_sender_gets_the_defaults_of_what_it_lacks() -> None:
    """Adapted once, where SENDER is loaded: what it lacks is the base class's default."""
    committer = GroupCommitter(None, Scripts())
    plain = load_sender(Settings(sender="tests.worker.senders:LegacySender"), Keys(), committer)
    assert isinstance(plain, Sender) and isinstance(plugin_of(plain), LegacySender)
    assert plain.can_send_text(_batch("hola")) and plain.max_part_chars == 4096
    assert not (plain.keeps_typing or plain.hands_over or plain.sends_templates)
    assert not plain.resumes_hand_over

    class Narrow:
        max_part_chars = 10
        resumes_hand_over = True

        async def send(self, batch: Batch, text: str, part: int) -> None: ...

        async def hand_over(self, batch: Batch, reason: str, detail: str) -> str:
            return "told"

    narrow = as_sender(Narrow())
    assert as_sender(narrow) is narrow and narrow.reply_parts("uno dos tres cuatro") == [
        "uno dos",
        "tres",
        "cuatro",
    ]
    assert narrow.hands_over and narrow.resumes_hand_over and not narrow.keeps_typing


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sender", "delivery"), [("PlainSender", "LeasedDelivery"), ("LegacySender", "")]
)
async def test_a_plain_object_sender_answers_a_real_turn(
    redis: Redis, prefix: str, fleet: WorkerFleet, sender: str, delivery: str
) -> None:
    """A sender with nothing but `send` (no optional method, no `max_part_chars`; with the
    `delivery` keyword or without it) is adapted where SENDER is loaded: the AI is asked,
    the reply goes out in parts of at most 4096 characters, each with the turn's `Delivery`
    only if `send` takes it, and the provider ids it returned are remembered."""
    person = "5491155550071"
    words = "palabra " * 600  # the reply is longer than one part
    await fleet.start(SENDER=f"tests.worker.senders:{sender}")
    await push_message(redis, prefix, person, "wamid.p1", words)
    memory = Keys(prefix).tenant(TENANT).memory(person)
    (remembered,) = await wait_for(lambda: redis.lrange(memory, 0, -1), "the exchange remembered")
    sent = [json.loads(r) for r in await redis.lrange(sent_key(prefix), 0, -1)]
    batch = sent[0]["batch"]
    assert [(s["batch"], s["part"], s["delivery"]) for s in sent] == [
        (batch, 0, delivery),
        (batch, 1, delivery),
    ]
    assert all(len(s["text"]) <= 4096 for s in sent)
    assert " ".join(s["text"] for s in sent) == f"reply to {batch}: {words.strip()}"
    assert json.loads(remembered)["out"] == [f"custom.{batch}.0", f"custom.{batch}.1"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BRAIN": "tests.worker.brains:NotABrain"}, "BRAIN="),
        ({"BRAIN": "tests.worker.brains:NOT_CALLABLE"}, "BRAIN="),
        ({"SENDER": "nowhere"}, "SENDER must be"),
        ({"LEASE_S": "2", "LEASE_RENEW_S": "2"}, "LEASE_RENEW_S"),
        ({"DEBOUNCE_WINDOW_S": "soon"}, "DEBOUNCE_WINDOW_S must be a number"),
    ],
)
def test_a_worker_with_a_bad_configuration_exits_2_naming_it(
    fleet: WorkerFleet, env: dict[str, str], message: str
) -> None:
    done = run_module("worker", env=fleet.env(**env))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("configuration error: ") and message in done.stderr
