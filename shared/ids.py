"""The shapes of provider ids that become part of a Redis key or of a URL.

A provider's id goes into our keys (`wa:{<tenant>}:c:<person>:…`, `seen:<channel>:<id>`,
`out:<id>`) and into the URLs we call with a token (`/{phone_number_id}/messages`, Chatwoot's
`/accounts/{account}/conversations/{conversation}`, Graph's `/{media id}`). The receiver accepts
only these shapes (anything else is dead-lettered, receiver/providers/parsing.py), and the
senders check them again before a URL is built, for data written before this rule.

- WhatsApp `phone_number_id` (our tenant) and media ids: Graph object ids, digits (up to 30).
- WhatsApp `wa_id`, `from`, `recipient_id`, an echo's `to`: a phone number, digits (up to 20;
  E.164 allows 15).
- WhatsApp business-scoped user ids (`user_id`, `from_user_id`, `recipient_user_id`,
  `to_user_id`): documented as an ISO 3166 alpha-2 country code, a period and up to 128
  alphanumeric characters (`US.13491208655302741918`); a parent BSUID adds `ENT.` after the
  country (`US.ENT.1181…`).
- WhatsApp message ids (`wamid.HBgL…`, base64): no documented grammar, so a conservative one:
  base64 and id punctuation (`A-Z a-z 0-9 . _ : = + / -`), at most 256 characters.
- Chatwoot ids: integers (receiver/providers/chatwoot_fields.py `chatwoot_id`); a Chatwoot tenant is
  `cw-<account>-<inbox>` (shared/chatwoot.py).

Tenants of the two providers cannot collide: a WhatsApp tenant is digits only, a Chatwoot
tenant always starts with `cw-`. None of these shapes holds `"`, `\\`, `{`, `}`, `/` (but a
message id, which is never part of a URL) or `..`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

IdCheck = Callable[[str], object]  # truthy when the id fits its shape

# On every webhook: digits are checked with str methods (ASCII digits: `isdigit` alone takes any
# script's, `\d` too), cheaper than a regex; the rest by compiled patterns.
_USER_ID = re.compile(r"[A-Z]{2}\.(?:ENT\.)?[A-Za-z0-9]{1,128}").fullmatch
is_user_id: IdCheck = _USER_ID
is_message_id: IdCheck = re.compile(r"[A-Za-z0-9._:=+/-]{1,256}").fullmatch


def is_phone_number_id(value: str) -> bool:
    """A WhatsApp `phone_number_id` (our tenant): a Graph object id, digits."""
    return len(value) <= 30 and value.isdigit() and value.isascii()


is_media_id: IdCheck = is_phone_number_id  # also a Graph object id


def is_wa_id(value: str) -> bool:
    """A phone number as Meta writes it (`wa_id`, `from`): digits, no `+`."""
    return len(value) <= 20 and value.isdigit() and value.isascii()


def is_person_id(value: str) -> bool:
    """A WhatsApp person: a phone number (digits) or a business-scoped user id."""
    if len(value) <= 20 and value.isdigit() and value.isascii():
        return True
    return _USER_ID(value) is not None


def is_chatwoot_id(value: str) -> bool:
    """Chatwoot's account, inbox and conversation ids: integers below 2**53 (16 digits)."""
    return len(value) <= 16 and value.isdigit() and value.isascii()
