"""The index of a tenant's conversations by last activity, for the ops page's inbox.

`wa:{T}:convs` is a ZSET person -> the ms (Redis clock) of the conversation's last activity:
a message, reaction or edit from the customer, a Chatwoot agent's message or an echo taken in
by the claim (claim.lua, one `ZADD` per call for every person it took something in for), a
turn's reply (finish.lua, `ZADD` when done) and a reply by hand (manual_end.lua). The receiver's
webhook path never writes it.

It is bounded where it grows: when a claim's `ZADD` adds a person who was not listed, the same
call drops the entries older than `KEPT_S` and all but the newest `KEPT`. Forgetting a person
removes their entry (forget.lua). The limits reach the Lua as placeholders
(shared/storage/lua_source.py).
"""

from __future__ import annotations

# The newest conversations a tenant's index keeps, and for how long after their last activity.
KEPT = 10_000
KEPT_S = 7 * 24 * 3600
KEPT_MS = KEPT_S * 1000
