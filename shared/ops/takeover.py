"""Human takeover on WhatsApp: a pause per person, during which the bot sends that person nothing.

A pause is the person's `human` key (`wa:{T}:c:<person>:human`, shared/keys.py), a JSON
`{by, why, since_ms, until_ms}` (Redis clock) with a PX, so it lapses by itself. While it
exists the claim (shared/lua/claim.lua) gives the bot no turn for the person: their due time
moves to the pause's end and their messages keep waiting in `pending`, where the ops page shows
them. When it lapses the waiting messages are answered like any others (the age check,
`REVIEW_AFTER_S`, still applies: messages older than that go to review as `too_old`); `resume`
lifts it at once and makes them due now.

Who sets one: a person (the ops page, `python -m worker.takeover pause`, a reply by hand), the
business writing
from the WhatsApp Business app (an echo, claim.lua, `HUMAN_PAUSE_S`), and a WhatsApp batch
parked for review for a reason that needs a person (`pauses_for_review`; the AI's hand-over is
one, finish.lua sets it with the review item). Automatic pauses never shorten a longer one; a
pause set by hand replaces whatever was there. Requeueing or dropping a review item lifts only
the pause that review set (`by` "review:<reason>", lib/human.lua), never a person's: a person's
pause meeting a longer review pause makes it the person's, and a review pause replacing a
person's shorter one gives it back when lifted (worker/review.py). A turn already running when
a pause is set is not stopped.

The calls here are the API the ops page and the CLI use; each change is one Lua script
(pause_human.lua, resume_human.lua), so it never races a claim. A reply sent by hand
(worker/manual_reply.py) pauses the person in the script that records it (manual_end.lua).
"""

from __future__ import annotations

from typing import Any

import orjson

from shared.conversation import late_failure_codes
from shared.fleet import wake
from shared.keys import Keys
from shared.storage.scripts import shared_scripts

# Review reasons after which the bot does NOT pause for the person: they say nothing about this
# conversation that a person must answer first. `too_old` is an outage's backlog (pausing would
# silence the bot for everyone parked by it, though their next message is new and answerable);
# `window_closed`: the person cannot be written to until they write again, and the bot answering
# what they write then is the conversation resuming; `token_expired`, `ai_auth` and `no_sender` are
# configuration faults of the whole tenant or fleet (nothing goes out anyway, and a pause would keep
# everyone silent for `HUMAN_PAUSE_S` after the fix); a late delivery failure
# (shared/conversation/late_failure_codes.py: the reply was answered, Meta could not deliver it)
# says nothing about what the person writes next, and the next turn's AI is told the reply never
# arrived. Every other reason (the AI's hand-over, `delivery_unknown`, `max_attempts`, a provider's
# refusal of this batch, a custom brain's or sender's `NeedsReview`) needs a person to look at this
# exchange, so the person's next messages wait for that person rather than get bot answers without
# its context.
NO_PAUSE_REVIEW_REASONS = frozenset(
    {"too_old", "token_expired", "ai_auth", "no_sender", *late_failure_codes.REASONS.values()}
    | {late_failure_codes.DELIVERY_FAILED}
)
# Only WhatsApp conversations pause: a Chatwoot conversation is handed over in Chatwoot.
PAUSING_CHANNELS = frozenset({"whatsapp"})


class TakeoverError(ValueError):
    """A pause that cannot be set as asked (the message says why)."""


def pauses_for_review(channel: str, reason: str) -> bool:
    """Whether a batch of `channel` parked for review as `reason` pauses the bot for its person."""
    return channel in PAUSING_CHANNELS and reason not in NO_PAUSE_REVIEW_REASONS


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
    raw = await shared_scripts().pause_human(
        redis, k, person=person, by=by, why=why, pause_ms=pause_ms
    )
    return _decode(raw)


async def resume(redis: Any, keys: Keys, tenant: str, person: str, *, by: str) -> bool:
    """Lift the person's pause; False when there was none (nothing changed). Messages or a batch
    waiting for them are made due now, in the same script, and the tenant is relayed to the
    fleet (shared/fleet/wake.py) so a worker with a free slot answers promptly. `by` is who lifted
    it (for the caller's audit log; the pause itself is deleted)."""
    k = keys.tenant(tenant)
    k.human(person)
    paused, due = await shared_scripts().resume_human(redis, k, person=person)
    if int(due):
        await wake.add(redis, keys.relay_queue, [tenant])
    return bool(int(paused))


async def pause_state(redis: Any, keys: Keys, tenant: str, person: str) -> dict[str, Any] | None:
    """The person's pause (`by`, `why`, `since_ms`, `until_ms`), None when the bot may answer."""
    raw = await redis.get(keys.tenant(tenant).human(person))
    return None if raw is None else _decode(raw)


def _decode(raw: Any) -> dict[str, Any]:
    value = orjson.loads(raw)
    if not isinstance(value, dict):
        raise TakeoverError(f"a pause that is not a JSON object: {raw!r}")
    return value
