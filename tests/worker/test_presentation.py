"""What the model is shown of a batch (shared/conversation/presentation.py), from webhooks shaped
as Meta's reference shows them (tests/fixtures/whatsapp/), parsed by the real receiver code: every
message type in full, the date and time in the tenant's time zone, quoted replies found in the
burst or the memory, and the built-in request carrying it (header and body blocks, the same
bytes when the memory renders it next turn). Pure functions: no Redis."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from receiver.providers.whatsapp import parse_body
from shared.conversation.batch import Batch, Message
from shared.conversation.presentation import Quotes, exchange, local_time, present
from shared.settings import Settings
from shared.settings.spec import ConfigError
from shared.settings.tenants import load_tenants
from tests.support.helpers import fixture_bytes
from tests.worker.support import batch_of
from worker.brains.prompt import build_request, render_context

TENANT = "106500000000001"
BA = "America/Argentina/Buenos_Aires"
# Claimed 96 s after the last fixture message (order.json, 1764422104): answered on time.
CLAIMED_MS = 1_764_422_200_000


def messages_of(name: str) -> list[Message]:
    """The messages of a fixture as the worker reads them (receiver event -> Message)."""
    parsed = parse_body(fixture_bytes(f"whatsapp/{name}"), 1_764_500_000_000)
    assert parsed.problems == []
    return [Message.from_event(e) for events in parsed.events.values() for e in events]


def batch(*messages: Message, history: list[dict[str, Any]] | None = None) -> Batch:
    return batch_of(list(messages), tenant=TENANT, claimed_ms=CLAIMED_MS, history=history)


def body_of(name: str) -> str:
    settings = Settings()
    return present(batch(*messages_of(name)), settings.tenant(TENANT), settings).body


BODIES = {
    "order.json": (
        "[order from catalog 7310000000000001]\n"
        "- product pizza-muzza-grande: quantity 2, 12500 ARS each\n"
        "- product empanada-carne: quantity 12, 1500 ARS each\n"
        "note: sin aceitunas por favor"
    ),
    "contacts.json": (
        "[shared a contact: Juan García: +54 9 11 5555 0002 (cell), juan@example.com (work),"
        " Plomería García]"
    ),
    "location.json": "[shared a location: Obelisco; Av. 9 de Julio s/n; -34.6037, -58.3816]",
    "interactive_list_reply.json": (
        "(replying to a message not in this conversation's memory)\n"
        '[chose "Martes 10:00" from a list (id slot-2): con la Dra. López]'
    ),
    "interactive_button_reply.json": '[pressed the button "Confirmar" (id confirm_sat_1600)]',
    "interactive_flow_reply.json": (
        "(replying to a message not in this conversation's memory)\n"
        "[filled in the form flow]\nfecha: 2025-12-06\nservicio: corte\n"
        "comentarios: llego 10 min tarde"
    ),
    "button_template_reply.json": (
        "(replying to a message not in this conversation's memory)\n"
        '[pressed the button "Confirmar" (payload CONFIRM_SAT_1600)]'
    ),
    "ad_referral.json": (
        '(came from an ad: headline "Turnos online", text "Reservá tu turno en 1 minuto",'
        " https://fb.me/3cr4Wqqkv)\nHola! vi el anuncio, ¿precio?"
    ),
    "forwarded.json": "(forwarded many times)\nmirá esta promo",
    "text.json": "Hola",
    # Types this module does not render show the receiver's text.
    "image.json": "[image: así está la canilla]",
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_each_message_type_is_shown_in_full(name: str) -> None:
    assert body_of(name) == BODIES[name]


def test_the_header_has_the_date_and_time_in_the_tenants_zone_and_the_senders_name() -> None:
    (order,) = messages_of("order.json")  # timestamp 1764422101: 13:15 UTC
    settings = Settings()
    header = present(batch(order), settings.tenant(TENANT), settings).header
    assert header == "Date and time: Saturday 29 November 2025, 13:15 (UTC)\nFrom: Ana Pérez"
    # The global TIMEZONE, then the tenant's timezone, which wins.
    in_kolkata = Settings().with_overrides(timezone="Asia/Kolkata")
    header = present(batch(order), in_kolkata.tenant(TENANT), in_kolkata).header
    assert header.startswith("Date and time: Saturday 29 November 2025, 18:45 (Asia/Kolkata)")
    per_tenant = in_kolkata.with_overrides(tenants={TENANT: {"timezone": BA}})
    header = present(batch(order), per_tenant.tenant(TENANT), per_tenant).header
    assert header.startswith(f"Date and time: Saturday 29 November 2025, 10:15 ({BA})")


def test_the_time_is_the_latest_messages_and_the_claim_when_no_message_has_one() -> None:
    (early,) = messages_of("image.json")
    (late,) = messages_of("order.json")
    settings = Settings()
    both = present(batch(early, late), settings.tenant(TENANT), settings)
    assert "13:15 (UTC)" in both.header
    unknown = present(batch(replace(late, ts=0, name="")), settings.tenant(TENANT), settings)
    # claimed_ms 1 764 422 200 000 is Saturday 29 November 2025, 13:16:40 UTC; no name, no From.
    assert unknown.header == "Date and time: Saturday 29 November 2025, 13:16 (UTC)"


def test_a_late_answer_says_when_and_how_late() -> None:
    """A batch answered LATE_AFTER_S (5 minutes) or more after its latest message (Meta
    redelivering after an outage, a requeue from review) says so under the sender's name, in
    the tenant's time zone; one answered sooner does not."""
    (order,) = messages_of("order.json")  # 13:15:01 UTC, 10:15 in Buenos Aires
    settings = Settings().with_overrides(tenants={TENANT: {"timezone": BA}})
    tenant = settings.tenant(TENANT)

    def header(late_s: int) -> str:
        claimed_ms = (order.ts + late_s) * 1000
        late = batch_of([order], tenant=TENANT, claimed_ms=claimed_ms)
        return present(late, tenant, settings).header

    assert header(299).splitlines() == [
        f"Date and time: Saturday 29 November 2025, 10:15 ({BA})",
        "From: Ana Pérez",
    ]
    assert header(3 * 3600 + 5 * 60).splitlines()[2] == (
        f"Answered: Saturday 29 November 2025, 13:20 ({BA}), 3 hours 5 minutes after their"
        " last message; this reply is late."
    )
    assert "Answered: Monday 1 December 2025, 13:15" in header(2 * 86400 + 3 * 3600)
    assert ", 2 days 3 hours after their last message" in header(2 * 86400 + 3 * 3600)
    assert ", 5 minutes after" in header(300)


def test_local_time_crosses_midnight_and_daylight_saving() -> None:
    # London's clocks go forward at 01:00 UTC on 29 March 2026: 00:30 UTC is 00:30 GMT there,
    # 01:30 UTC is 02:30 BST; in Buenos Aires (UTC-3) both are still the evening before.
    assert local_time(1774744200, "Europe/London") == "Sunday 29 March 2026, 00:30 (Europe/London)"
    assert local_time(1774747800, "Europe/London") == "Sunday 29 March 2026, 02:30 (Europe/London)"
    assert local_time(1774747800, BA) == f"Saturday 28 March 2026, 22:30 ({BA})"


def test_a_quote_shows_the_quoted_text_from_the_burst_or_the_memory() -> None:
    (reply,) = messages_of("reply_with_context.json")  # quotes wamid.OUTBOUND0001
    settings = Settings()
    tenant = settings.tenant(TENANT)
    history = [
        {
            "header": "Date and time: …",
            "user": "¿tienen turno el sábado?",
            "assistant": "Sí: el sábado a las 10:00 o a las 11:30.",
            "ids": ["wamid.EARLIER1"],
            "out": ["wamid.OUTBOUND0001"],
        }
    ]
    shown = present(batch(reply, history=history), tenant, settings).body
    assert shown == (
        '(replying to your message "Sí: el sábado a las 10:00 o a las 11:30.")\n'
        "sí, ese horario me sirve"
    )
    # Quoting their own earlier message, remembered by its id.
    quoting_own = _quoting(reply, "wamid.EARLIER1")
    shown = present(batch(quoting_own, history=history), tenant, settings).body
    assert shown.startswith('(replying to their earlier message "¿tienen turno el sábado?")')
    # Quoting a message of the same burst.
    (first,) = messages_of("text.json")
    shown = present(batch(first, _quoting(reply, first.id)), tenant, settings).body
    assert shown == 'Hola\n(replying to their message "Hola")\nsí, ese horario me sirve'
    # A quote of something older than the memory (or an exchange remembered without ids).
    shown = present(batch(reply, history=[{"user": "x", "assistant": "y"}]), tenant, settings)
    assert "(replying to a message not in this conversation's memory)" in shown.body


def test_a_long_quote_is_cut() -> None:
    (reply,) = messages_of("reply_with_context.json")
    history = [{"user": "u", "assistant": "a" * 1000, "out": ["wamid.OUTBOUND0001"]}]
    settings = Settings()
    shown = present(batch(reply, history=history), settings.tenant(TENANT), settings).body
    assert f'your message "{"a" * 299}…")' in shown


def _quoting(message: Message, wamid: str) -> Message:
    raw = {**message.raw, "id": "wamid.Q", "context": {"id": wamid}}
    return replace(message, id="wamid.Q", raw=raw)


def test_bad_raw_shapes_fall_back_to_the_receivers_text() -> None:
    """A message whose raw content is not what Meta documents shows the receiver's text."""
    (order,) = messages_of("order.json")
    for broken in ({"type": "order", "order": "nope"}, {"type": "order"}, None, "raw"):
        assert body_of_message(replace(order, raw=broken)) == "[order: 2 items]"
    flow = {"type": "nfm_reply", "nfm_reply": {"name": "flow", "response_json": "{not json"}}
    (list_reply,) = messages_of("interactive_list_reply.json")
    odd = replace(list_reply, raw={"type": "interactive", "interactive": flow})
    assert body_of_message(odd) == "[filled in the form flow]\n{not json"
    # Another channel's messages show their text as they are.
    assert body_of_message(replace(order, channel="chatwoot")) == "[order: 2 items]"


def body_of_message(message: Message) -> str:
    settings = Settings()
    return present(batch(message), settings.tenant(TENANT), settings).body


def test_the_request_carries_the_presentation_and_memory_renders_it_the_same_next_turn() -> None:
    """The header and body are the current user turn's two blocks; the exchange the memory
    keeps renders as the same two blocks next turn (byte for byte: the cache prefix)."""
    settings = Settings().with_overrides(tenants={TENANT: {"timezone": BA}})
    first = batch(*messages_of("order.json"))
    request = build_request(settings, settings.tenant(TENANT), first)
    current = request["messages"][-1]["content"]
    shown = present(first, settings.tenant(TENANT), settings)
    assert [b["text"] for b in current] == [shown.header, shown.body]
    assert "10:15 (America/Argentina/Buenos_Aires)" in current[0]["text"]
    assert request["system"][0]["text"] == settings.system_prompt  # no date in the prefix

    remembered = orjson.loads(orjson.dumps(exchange(first, settings, "¡Listo!", ["wamid.O1"])))
    second = batch(*messages_of("contacts.json"), history=[remembered])
    later = build_request(settings, settings.tenant(TENANT), second)["messages"]
    assert later[0]["content"] == [{"type": "text", "text": t} for t in (shown.blocks)]
    assert later[1]["content"] == [{"type": "text", "text": "¡Listo!"}]
    assert remembered["ids"] == ["wamid.FIXTURE0101"] and remembered["out"] == ["wamid.O1"]


def test_a_bad_time_zone_stops_start_up(tmp_path: Path) -> None:
    """`TIMEZONE` and a tenant's `timezone` must be IANA names zoneinfo knows."""
    assert Settings.from_env({"TIMEZONE": BA}).timezone == BA
    for bad in ("Mars/Olympus", "UTC+3", "../etc/passwd"):
        with pytest.raises(ConfigError, match="TIMEZONE"):
            Settings.from_env({"TIMEZONE": bad})
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(f'[tenants."{TENANT}"]\ntimezone = "{BA}"\n')
    assert load_tenants(str(tenants))[TENANT]["timezone"] == BA
    for bad_value in ('"Mars/Olympus"', "3"):
        tenants.write_text(f'[tenants."{TENANT}"]\ntimezone = {bad_value}\n')
        with pytest.raises(ConfigError, match="timezone must be an IANA time zone name"):
            load_tenants(str(tenants))


def test_a_reaction_names_our_reply_it_was_about_from_the_memory() -> None:
    """The intake only knows the texts of waiting and running messages; a reaction to our
    answer (the usual case) names that answer from the memory's `out` ids."""
    history = [
        {
            "user": "¿tienen turno el sábado?",
            "assistant": "Sí: el sábado a las 10:00.",
            "ids": ["wamid.EARLIER1"],
            "out": ["wamid.OUTBOUND0001"],
        }
    ]
    quotes = Quotes(batch(*messages_of("text.json"), history=history))
    reaction = {"what": "reaction", "target": "wamid.OUTBOUND0001"}
    thumbs = {**reaction, "raw": {"reaction": {"emoji": "👍"}}}
    assert render_context([thumbs], quotes) == [
        '[the customer reacted 👍 to your message "Sí: el sábado a las 10:00."]'
    ]
    assert render_context([reaction], quotes) == [
        '[the customer removed their reaction to your message "Sí: el sábado a las 10:00."]'
    ]
    unknown = {**thumbs, "target": "wamid.GONE"}
    assert render_context([unknown], quotes) == [
        "[the customer reacted 👍 to the message (id wamid.GONE)]"
    ]


# --- each thing once (issue 22, item 4) ---------------------------------------------------------
IMAGE_BLOCKS = [
    {"type": "text", "text": "[image: así está la canilla]"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
]


def test_an_event_stored_by_the_old_receiver_presents_its_file_once() -> None:
    """Events already in Redis carry the label in their text (`[image: caption]`): with the
    files beside, the body leaves the file to its blocks whatever the text says; without (a
    custom brain that shows no files), the label stands in its place, once."""
    settings = Settings()
    tenant = settings.tenant(TENANT)
    (image,) = messages_of("image.json")
    assert image.text == "[image: así está la canilla]"
    (hello,) = messages_of("text.json")
    both = batch(hello, image)
    beside = present(both, tenant, settings, files_beside=True).body
    assert "canilla" not in beside and "[image" not in beside
    assert present(both, tenant, settings).body.count("así está la canilla") == 1

    quoting = replace(image, raw={**image.raw, "context": {"forwarded": True}})
    pointer = present(batch(quoting), tenant, settings, files_beside=True).body
    assert pointer == "(forwarded)\n[sent an image, shown below]"


def test_a_burst_of_files_only_sends_no_empty_body_and_is_remembered_so() -> None:
    """An image alone: the user turn is the header, then the label and the image (no
    "[empty message]"); the memory keeps an empty body and the label, which the next turn
    renders as header and label, the same bytes up to where the image was."""
    settings = Settings()
    (image,) = messages_of("image.json")
    first = batch(image)
    request = build_request(settings, settings.tenant(TENANT), first, media=IMAGE_BLOCKS)
    current = request["messages"][-1]["content"]
    assert [b["type"] for b in current] == ["text", "text", "image"]
    assert current[0]["text"].startswith("Date and time: ")
    assert current[1]["text"] == "[image: así está la canilla]"

    notes = ["[image: así está la canilla]"]
    remembered = orjson.loads(orjson.dumps(exchange(first, settings, "¡Uh!", [], notes)))
    assert remembered["user"] == "" and remembered["media"] == notes
    later = build_request(
        settings, settings.tenant(TENANT), batch(*messages_of("text.json"), history=[remembered])
    )["messages"]
    assert [b["text"] for b in later[0]["content"]] == [current[0]["text"], notes[0]]

    # A reaction since the last turn still comes in a block of its own, after the header.
    reacted = replace(first, context=[{"what": "request_welcome"}], presented={})
    request = build_request(settings, settings.tenant(TENANT), reacted, media=IMAGE_BLOCKS)
    texts = [b.get("text") for b in request["messages"][-1]["content"]]
    assert texts[1:] == ["[the customer opened the chat]", IMAGE_BLOCKS[0]["text"], None]


def test_a_message_meta_could_not_deliver_is_a_sentence_to_act_on() -> None:
    """An `errors` entry (131000 on an interactive message), `unsupported`, an interactive
    message or a button without the reply: what it was, and what to do."""
    (list_reply,) = messages_of("interactive_list_reply.json")
    error = {
        "code": 131000,
        "title": "Something went wrong",
        "error_data": {"details": "Unsupported webhook payload"},
    }
    broken = replace(list_reply, raw={"type": "interactive", "errors": [error]})
    assert body_of_message(broken) == (
        "[the customer sent something that could not be shown here (interactive: Something"
        " went wrong: Unsupported webhook payload (code 131000)); ask them to send it again"
        " or to describe it]"
    )
    (unsupported,) = messages_of("unsupported.json")
    assert body_of_message(unsupported).startswith(
        "[the customer sent something that could not be shown here (unsupported: edit:"
        " Message type unknown: Message type is currently not supported. (code 131051));"
    )
    empty = replace(list_reply, raw={"type": "interactive", "interactive": {"type": "x"}})
    assert "(interactive x);" in body_of_message(empty)
    (button,) = messages_of("button_template_reply.json")
    assert "(button);" in body_of_message(replace(button, raw={"type": "button", "button": {}}))
