"""Human takeover on WhatsApp: a pause per person, during which the bot sends that person nothing.

A pause is the person's `human` key (`wa:{T}:c:<person>:human`, shared/keys.py), a JSON
`{by, why, since_ms, until_ms}` (Redis clock) with a PX, so it lapses by itself. While it
exists the claim (shared/lua/claim.lua) gives the bot no turn for the person: their due time
moves to the pause's end and their messages keep waiting in `pending`, where the ops page shows
them. When it lapses the waiting messages are answered like any others (the age check,
`REVIEW_AFTER_S`, still applies: messages older than that go to review as `too_old`); `resume`
lifts it at once and makes them due now.

Who sets one: a person (the ops page, `python -m worker.takeover pause`), the business writing
from the WhatsApp Business app (an echo, claim.lua, `HUMAN_PAUSE_S`), and a WhatsApp batch
parked for review for a reason that needs a person (`pauses_for_review`; the AI's hand-over is
one, finish.lua sets it with the review item). Automatic pauses never shorten a longer one; a
pause set by hand replaces whatever was there. Requeueing or dropping a review item lifts it
(worker/review.py). A turn already running when a pause is set is not stopped.

The calls here are the API the ops page and the CLI use; each change is one Lua script
(pause_human.lua, resume_human.lua), so it never races a claim. `record_human_reply` is for a
reply a person sent by hand (the ops page): it enters the inbox as an echo, so the intake
treats it exactly as what the business writes from the WhatsApp Business app.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from shared import events, script_calls, wake
from shared.keys import Keys
from shared.scripts import Scripts

# Review reasons after which the bot does NOT pause for the person: they say nothing about
# this conversation that a person must answer first. `too_old` is an outage's backlog (pausing
# would silence the bot for everyone parked by it, though their next message is new and
# answerable); `window_closed`: the person cannot be written to until they write again, and
# the bot answering what they write then is the conversation resuming; `token_expired`,
# `ai_auth` and `no_sender` are configuration faults of the whole tenant or fleet (nothing goes
# out anyway, and a pause would keep everyone silent for `HUMAN_PAUSE_S` after the fix). Every
# other reason (the AI's hand-over, `delivery_unknown`, `max_attempts`, a provider's refusal of
# this batch, a custom brain's or sender's `NeedsReview`) needs a person to look at this
# exchange, so the person's next messages wait for that person rather than get bot answers
# without its context.
NO_PAUSE_REVIEW_REASONS = frozenset(
    {"too_old", "window_closed", "token_expired", "ai_auth", "no_sender"}
)
# Only WhatsApp conversations pause: a Chatwoot conversation is handed over in Chatwoot.
PAUSING_CHANNELS = frozenset({"whatsapp"})

_SCRIPTS: Scripts | None = None


class TakeoverError(ValueError):
    """A pause that cannot be set as asked (the message says why)."""


def pauses_for_review(channel: str, reason: str) -> bool:
    """Whether a batch of `channel` parked for review as `reason` pauses the bot for its person."""
    return channel in PAUSING_CHANNELS and reason not in NO_PAUSE_REVIEW_REASONS


def _scripts() -> Scripts:
    global _SCRIPTS
    if _SCRIPTS is None:
        _SCRIPTS = Scripts()
    return _SCRIPTS


async def pause(
    redis: Any, keys: Keys, tenant: str, person: str, *, by: str, why: str, seconds: float
) -> dict[str, Any]:
    """Pause the bot for `person` for `seconds` (replacing any pause there); returns the pause
    as stored: `by`, `why`, `since_ms`, `until_ms` (Redis clock). Raises TakeoverError for a
    non-positive or absurd duration, or an id unusable in a key (shared.keys.KeyError_)."""
    if not 0 < seconds <= 366 * 86400:
        raise TakeoverError(f"a pause lasts more than 0 s and at most a year, not {seconds!r}")
    pause_ms = max(1, int(seconds * 1000))
    k = keys.tenant(tenant)
    k.human(person)  # checks the person id before anything is written
    raw = await _scripts().pause_human(
        redis, *script_calls.pause_human(k, person=person, by=by, why=why, pause_ms=pause_ms)
    )
    return _decode(raw)


async def resume(redis: Any, keys: Keys, tenant: str, person: str, *, by: str) -> bool:
    """Lift the person's pause; False when there was none (nothing changed). Messages or a batch
    waiting for them are made due now, in the same script, and the tenant is relayed to the
    fleet (shared/wake.py) so a worker with a free slot answers promptly. `by` is who lifted
    it (for the caller's audit log; the pause itself is deleted)."""
    k = keys.tenant(tenant)
    k.human(person)
    paused, due = await _scripts().resume_human(redis, *script_calls.resume_human(k, person=person))
    if int(due):
        await wake.add(redis, keys.relay_queue, [tenant])
    return bool(int(paused))


async def pause_state(redis: Any, keys: Keys, tenant: str, person: str) -> dict[str, Any] | None:
    """The person's pause (`by`, `why`, `since_ms`, `until_ms`), None when the bot may answer."""
    raw = await redis.get(keys.tenant(tenant).human(person))
    return None if raw is None else _decode(raw)


async def record_human_reply(
    redis: Any,
    keys: Keys,
    tenant: str,
    person: str,
    *,
    message_id: str,
    text: str,
    dedupe_ttl_s: int = 7 * 24 * 3600,
) -> bool:
    """A person of the business sent `text` to `person` by hand (the provider's id
    `message_id`): store it as an echo event (`ingest.lua`, deduplicated on the id) and wake
    the fleet. The intake then does what an echo does (shared/lua/lib/human.lua): the person is
    paused (never shorter than a pause already there), the text enters their memory marked as
    a human's, answering the messages that waited, and no turn starts. False: this id was
    recorded already (nothing changed)."""
    k = keys.tenant(tenant)
    k.human(person)
    now_ms = int(time.time() * 1000)
    event = events.echo_event(
        channel="whatsapp",
        tenant=tenant,
        person=person,
        message_id=message_id,
        type="text",
        text=text,
        ts=now_ms // 1000,
        received_ms=now_ms,
        raw={"id": message_id, "type": "text", "text": {"body": text}, "by_hand": True},
    )
    await redis.sadd(keys.tenants, tenant)  # the registry first, as the receiver does
    (stored,) = await _scripts().ingest(
        redis,
        *script_calls.ingest(
            k,
            seen=[k.seen(events.dedupe_id(event))],
            dedupe_ttl_s=dedupe_ttl_s,
            events=[events.encode(event)],
        ),
    )
    await wake.add(redis, keys.wake_queue, [tenant])
    return bool(int(stored))


def _decode(raw: Any) -> dict[str, Any]:
    value = orjson.loads(raw)
    if not isinstance(value, dict):
        raise TakeoverError(f"a pause that is not a JSON object: {raw!r}")
    return value
