"""Settings of the Chatwoot catch-up (worker/fleet/chatwoot_catchup.py): how often it runs, how far
back it reads, how many API calls a run may make.

A group of its own (composed into `Settings` like those of shared/settings/fields.py), next to
the Chatwoot settings it goes with.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.settings.spec import setting


@dataclass(frozen=True)
class CatchUpSettings:
    chatwoot_catchup_interval_s: float = setting(
        "CHATWOOT_CATCHUP_INTERVAL_S",
        300.0,
        "how often one worker of the fleet reads Chatwoot's recent conversations and takes in"
        " the messages whose webhook never arrived ([catch-up](providers/chatwoot.md#catch-up));"
        " 0: only after a webhook the receiver could not store. Only with"
        " `CHATWOOT_API_ACCESS_TOKEN` (or a tenant's token)",
        at_least=0,
    )
    chatwoot_catchup_horizon_s: float = setting(
        "CHATWOOT_CATCHUP_HORIZON_S",
        86400.0,
        "the catch-up reads back at most this far; older messages it never takes in (those"
        " it takes that are older than `REVIEW_AFTER_S` go to review as usual); at most half of"
        " `DEDUPE_TTL_S`, whatever is set",
        above=0,
    )
    chatwoot_catchup_max_calls: int = setting(
        "CHATWOOT_CATCHUP_MAX_CALLS",
        300,
        "Chatwoot API calls one catch-up run makes at most (conversation pages of 25 and"
        " message reads of 20); what it did not reach is read on the next run",
        above=0,
    )
