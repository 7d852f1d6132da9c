"""Batch.from_claim: the claim script's row (bytes, as redis-py returns it) into a Batch."""

from __future__ import annotations

from dataclasses import fields, replace

import orjson

from shared import events
from shared.conversation.batch import Batch, Message, plain_text


def _event(i: int, **changes: object) -> dict[str, object]:
    event = events.message_event(
        channel="whatsapp",
        person="5491155550001",
        message_id=f"wamid.{i}",
        type="text",
        text=f"mensaje {i}",
        ts=1_700_000_000 + i,
        received_ms=1_700_000_000_000 + i,
        raw={"from": "5491155550001", "id": f"wamid.{i}", "type": "text", "context": {}},
    )
    event.update(changes)
    return event


def _row(messages: bytes, **fields: object) -> list[bytes]:
    flat: list[bytes] = [b"5491155550001", b"worker-a:7:1"]
    base = {
        "id": "1700000000123-42",
        "person": "5491155550001",
        "attempt": "2",
        "created_ms": "1700000000123",
        "size": "3",
        "messages": messages,
        "token": "worker-a:7:1",
        "claimed_ms": "1700000005000",
        "due_ms": "1700000004321",
        **fields,
    }
    for key, value in base.items():
        flat += [key.encode(), value if isinstance(value, bytes) else str(value).encode()]
    return flat


def test_from_claim_reads_every_field_and_the_messages_in_order() -> None:
    messages = b"[" + b",".join(events.encode(_event(i)) for i in range(3)) + b"]"
    batch = Batch.from_claim("106540352242922", list(_row(messages)))
    assert batch.tenant == "106540352242922" and batch.person == "5491155550001"
    assert batch.id == "1700000000123-42" and batch.token == "worker-a:7:1"
    assert batch.attempt == 2 and batch.claimed_ms == 1_700_000_005_000
    assert batch.due_ms == 1_700_000_004_321 and batch.requeued is False
    assert [m.id for m in batch.messages] == ["wamid.0", "wamid.1", "wamid.2"]
    assert batch.texts == ["mensaje 0", "mensaje 1", "mensaje 2"]
    # The event keeps of WhatsApp's message what its fields do not hold; `raw` is it whole.
    raw = {"from": "5491155550001", "id": "wamid.1", "timestamp": "1700000001", "type": "text"}
    raw |= {"text": {"body": "mensaje 1"}, "context": {}}
    assert batch.messages[1] == Message(
        id="wamid.1", type="text", text="mensaje 1", ts=1_700_000_001, raw=raw
    )
    assert batch.oldest_ts == 1_700_000_000
    # The messages' JSON is kept byte for byte (review items embed it unparsed).
    assert batch.messages_json == messages
    assert "messages" not in batch.fields and batch.fields["size"] == "3"


def test_from_claim_types_context_name_and_requeued() -> None:
    messages = orjson.dumps(
        [
            _event(1, type="image", text="", name="Ana", context="wamid.quoted"),
            _event(2, type="location", text="", ts=0),
        ]
    )
    batch = Batch.from_claim("t", list(_row(messages, requeued=1, due_ms="1.7e12")))
    assert batch.requeued is True
    assert batch.due_ms == 1_700_000_000_000
    first, second = batch.messages
    assert (first.type, first.name, first.context) == ("image", "Ana", "wamid.quoted")
    assert second.type == "location" and second.ts == 0
    assert batch.oldest_ts == 1_700_000_001, "messages without a timestamp are ignored"


def test_oldest_ts_is_zero_when_no_message_has_a_timestamp() -> None:
    batch = Batch.from_claim("t", list(_row(orjson.dumps([_event(1, ts=0)]))))
    assert batch.oldest_ts == 0


def test_a_retried_batch_keeps_its_error_field() -> None:
    row = _row(orjson.dumps([_event(1)]), last_error="RuntimeError: boom", token="")
    batch = Batch.from_claim("t", list(row))
    assert batch.fields["last_error"] == "RuntimeError: boom"
    assert batch.token == "worker-a:7:1", "the token is the claim's, not the stale field"


def test_from_claim_sets_every_field_as_the_constructor_would() -> None:
    """from_claim builds the frozen Batch and its Messages without their `__init__`."""
    bare = _event(2)
    del bare["raw"]  # a text's event keeps none when the provider's object says no more
    messages = orjson.dumps([_event(1), bare])
    batch = Batch.from_claim("t", list(_row(messages)))
    assert set(vars(batch)) == {f.name for f in fields(Batch)}
    assert batch == replace(batch) and batch.presented == {}
    first, second = batch.messages
    # `raw` is restored when read, and then the message's own as if it had been given.
    assert set(vars(second)) - {"_unrestored"} == {f.name for f in fields(Message)} - {"raw"}
    assert plain_text(second) and not plain_text(first)
    assert second.raw == events.restore_raw(bare, "5491155550001")
    assert set(vars(second)) == {f.name for f in fields(Message)} and not plain_text(second)
    assert first == Message(**{f.name: getattr(first, f.name) for f in fields(Message)})
    assert Message("m", "text", "hola", 0).raw is None
