"""Claims whose answer never came, and the batches they locked, handed back.

Redis runs every command it read, even one whose client gave up waiting: a Redis that froze (a
stalled host, a long fork, SIGSTOP) runs them all when it continues, and one that is merely slow
runs them late. A claim run so locks batches for tokens that no turn holds, since a worker learns
its tokens only from the claim's answer; they used to wait out their whole lease (`LEASE_S`, 120 s
by default) after Redis answered again.

Two steps keep a freeze down to seconds:

- Each claim says when, on Redis's clock, its worker stops waiting for the answer
  (`answer_by_ms`: `REDIS_TIMEOUT_S` from the send, Redis's clock learnt from the claims'
  answers). Run later, it claims nothing (claim.lua).
- A claim that failed on Redis (timed out, connection lost) may have run before that time. Once
  Redis's clock has passed it, the worker asks Redis to hand back whatever such a call locked
  (unclaim.lua: due again at once, the same batch, attempts unchanged), and claims again.

No turn ever held a handed-back token, so two turns of one person cannot overlap (invariant 3,
docs/invariants.md); a lock a running turn holds was taken by a claim that answered, never
listed here.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.settings import Settings
from worker.conversation_store import Claim, ConversationStore

log = logging.getLogger("worker.fleet.scheduler")  # the scheduler's lines, whichever module

# A claim call that ended so may have run in Redis all the same (its answer was lost).
ANSWER_LOST = (RedisConnectionError, RedisTimeoutError, OSError)
# How often the hand-back is tried while Redis's clock has not passed the claims' answer time
# yet (at most REDIS_TIMEOUT_S after they were sent).
HAND_BACK_EVERY_S = 0.25
# A difference from the known offset of Redis's clock larger than this is a clock that was set.
CLOCK_JUMP_MS = 1000


class UnansweredClaims:
    """One worker's claims whose answer never came, by tenant, until handed back."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._calls: dict[str, dict[str, int]] = {}  # tenant -> {token prefix: answer_by_ms}
        self._since: dict[str, float] = {}  # tenant -> loop time of its first such call
        self._offset_ms: float | None = None  # Redis's clock minus this host's

    def __bool__(self) -> bool:
        return bool(self._calls)

    async def claim(
        self, store: ConversationStore, tenant: str, max_batches: int, token_prefix: str
    ) -> Claim:
        """`store.claim` with its answer time; a call that failed on Redis is remembered, to
        hand back what it may have locked."""
        answer_by = self.answer_by_ms()
        try:
            claim = await store.claim(tenant, max_batches, token_prefix, answer_by)
        except ANSWER_LOST:
            if max_batches > 0:  # it may have run, or may still run: handed back later
                self.lost(tenant, token_prefix, answer_by)
            raise
        self.answered(claim.now_ms)
        return claim

    def answer_by_ms(self) -> int:
        """When, on Redis's clock, a claim sent now is no longer awaited: `REDIS_TIMEOUT_S`
        from now (0, no limit, until a claim answered: Redis's clock is not known yet). Any
        error in it is safe: a claim run later claims nothing; one run earlier, its answer
        lost, is handed back."""
        if self._offset_ms is None:
            return 0
        return int(time.time() * 1000 + self._offset_ms + self._settings.redis_timeout_s * 1000)

    def answered(self, redis_now_ms: int) -> None:
        """A claim answered, Redis's clock then `redis_now_ms`. An answer is read after Redis
        ran the call, so the largest offset seen is the truest (a busy event loop reads answers
        late); a jump of over a second is a clock that was set, taken as it comes."""
        seen = redis_now_ms - time.time() * 1000
        known = self._offset_ms
        if known is None or abs(seen - known) > CLOCK_JUMP_MS:
            self._offset_ms = seen
        else:
            self._offset_ms = max(known, seen)

    def lost(self, tenant: str, token_prefix: str, answer_by_ms: int) -> None:
        """A claim of `tenant` failed on Redis: it may have run, or may still run. Without an
        answer time it cannot be handed back safely (it could run after the hand-back): its
        batches, if any, wait out their lease as before."""
        if not answer_by_ms:
            return
        self._calls.setdefault(tenant, {})[token_prefix] = answer_by_ms
        self._since.setdefault(tenant, asyncio.get_running_loop().time())

    async def hand_back(self, store: ConversationStore) -> set[str]:
        """Hand back what the lost claims locked, for each tenant whose claims' answer time
        Redis's clock has passed; the tenants that got batches back (to claim at once). Raises
        what Redis raises while it does not answer: the caller tries again later."""
        now = asyncio.get_running_loop().time()
        handed_back = set()
        for tenant, calls in list(self._calls.items()):
            prefixes = list(calls)
            try:
                handed = await store.unclaim(tenant, prefixes, max(calls.values()))
            except ResponseError as exc:
                # An error answer would only repeat itself, and must not stop the claims:
                # those batches wait out their lease instead, as before.
                log.error("could not hand back claims of tenant=%s: %r", tenant, exc)
                self._forget(tenant)
                continue
            if handed < 0:
                if self._since.get(tenant, now) + self._settings.lease_s < now:
                    # Redis's clock lags this host's far more than thought: those leases
                    # ended anyway, the claims take the batches back (leases_expired).
                    self._forget(tenant)
                continue  # one of them may still run: again shortly (HAND_BACK_EVERY_S)
            for token_prefix in prefixes:
                calls.pop(token_prefix, None)
            if not calls:
                self._forget(tenant)
            if handed:
                log.warning(
                    "handed back %d batch(es) of tenant=%s locked by claims whose answer "
                    "never came",
                    handed,
                    tenant,
                )
                handed_back.add(tenant)
        return handed_back

    def _forget(self, tenant: str) -> None:
        self._calls.pop(tenant, None)
        self._since.pop(tenant, None)
