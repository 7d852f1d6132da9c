"""Loading brains and senders from BRAIN / SENDER: built-ins, `package.module:attr`, and
errors that name the variable (in-process, and a worker process that refuses to start)."""

from __future__ import annotations

import pytest

from shared.conversation.batch import Batch, Message
from shared.keys import Keys
from shared.senders.loading import OutboxSender, load_sender
from shared.settings import ConfigError, Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.worker.brains import STATIC_BRAIN, RecordingBrain
from tests.worker.support import WorkerFleet, run_module
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
