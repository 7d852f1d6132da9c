"""The fleet's pause of AI calls while the AI fails as a whole: outages are waited out, not counted.

When a call of the AI fails as a whole (`AIUnavailable`: 429, 529, another 5xx, a timeout, no
connection; worker/brains/ai_errors.py), the worker sets the fleet-wide key `<prefix>:ai:paused`
(JSON `until_ms`, `level`, `since_ms`, `why`, `by`). Until `until_ms` no worker calls the AI:
each batch it claims is put back to wait, finished as a retry that does not count the attempt
(finish.lua's `count_attempt`), before the read receipt and typing indicator (the person sees
nothing promised). Only `REVIEW_AFTER_S` ends a batch's wait: claimed that old, it goes to
review as too_old, as any batch does (worker/turn/turn.py).

- **How long.** The first pause is `AI_OUTAGE_PAUSE_S` times a jitter of up to +20 %; each
  failed probe doubles it (`level`), capped at `AI_OUTAGE_MAX_PAUSE_S`: while the AI keeps
  failing the fleet asks it again every `AI_OUTAGE_MAX_PAUSE_S` (4 s by default), so it learns
  it is back at most that long after. A `retry-after` the provider sent is honoured: the pause
  is at least that long (with the jitter while under the cap; exactly it beyond the cap).
  Calls that were in flight when the pause was set and fail too do not lengthen it: only a
  probe's failure, or a failure while no pause is known, does.
- **When batches come due.** The batch whose failure set the pause waits exactly the pause
  (plus `WAIT_MARGIN_S`): it is the next probe, due when the pause ends, so the probe interval
  is the pause and not the pause plus a jitter. Every other batch waits for the pause's end
  plus a jitter of up to `AI_OUTAGE_PAUSE_S`, so the fleet's batches do not all come due at one
  instant; one that comes due while the probe is out looks again after half to one
  `AI_OUTAGE_PAUSE_S`. When the probe is answered, every waiting batch is therefore due within
  about `AI_OUTAGE_PAUSE_S` of it, not a pause later.
- **Who asks again.** When the pause ends the key stays (its PX is the pause plus
  `AI_OUTAGE_MAX_PAUSE_S`, so the level is remembered) and the first worker to `SET
  <prefix>:ai:probe <token> NX PX` asks the AI with its batch: the probe. The others put their
  batches back as above. A probe that gets an answer deletes the pause, and the fleet calls the
  AI again; one that fails sets a longer pause, then releases the token (in that order: a
  worker that wins the token re-reads the pause after the SET, so it cannot probe on a stale
  view). A probe whose worker dies leaves the token to expire (`AI_TIMEOUT_S` + 5 s: the
  fleet's batches wait that long at most), and another worker probes.
- **How often Redis is read.** Each worker keeps the pause it last read for `REFRESH_S`: a
  healthy fleet reads the key about twice a second per process, not once per turn. A worker
  may therefore start calls for up to `REFRESH_S` after another paused the fleet; they fail
  and wait like the rest, without lengthening the pause.
- **Redis away.** A worker that cannot read the pause calls the AI (the turn's own Redis calls
  decide what happens to it); one that cannot write it still puts its batch back for the pause
  it computed.

The keys are fleet-wide and never used inside a tenant's script (invariant 9).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import RedisClusterException, RedisError

from shared.conversation.errors import AIUnavailable, TurnError
from shared.fleet.ai_pause import Pause
from shared.keys import Keys
from shared.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long a worker trusts the pause it last read before reading it again.
REFRESH_S = 0.5
# A pause is lengthened by up to this share, at random, so that fleets (and the probes of
# successive pauses) do not march in step.
PAUSE_JITTER = 0.2
# A batch waits this much past the pause's end at least (clocks and rounding to ms), so it is
# not claimed a hair before the end and sent back again.
WAIT_MARGIN_S = 0.05
# The probe token outlives the probe's AI call by this much.
PROBE_MARGIN_S = 5.0
_REDIS_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)


@dataclass(frozen=True)
class Admission:
    """The gate's answer before a turn asks the AI: wait (`wait_s` > 0, `why`), or go, as
    the fleet's probe when `probe` (the token) is set."""

    wait_s: float = 0.0
    why: str = ""
    probe: str = ""


GO = Admission()


class AIPaused(TurnError):
    """The AI is paused fleet-wide: the batch waits `wait_s`, its attempt not counted."""

    def __init__(self, wait_s: float, detail: str) -> None:
        super().__init__(detail)
        self.wait_s = wait_s
        self.detail = detail


class AIPause:
    """One worker's view of the fleet's pause, and its part in it. `rng` for tests."""

    def __init__(
        self,
        redis: Any,
        keys: Keys,
        settings: Settings,
        worker_id: str,
        rng: random.Random | None = None,
    ) -> None:
        self._redis = redis
        self._key = keys.ai_paused
        self._probe_key = keys.ai_probe
        self._first_s = settings.ai_outage_pause_s
        self._max_s = settings.ai_outage_max_pause_s
        self._probe_ms = int((settings.ai_timeout_s + PROBE_MARGIN_S) * 1000)
        self._worker_id = worker_id
        self._rng = rng or random.Random()
        self._known: Pause | None = None
        self._read_at = float("-inf")  # time.monotonic() of the last read
        self._reading: asyncio.Future[None] | None = None  # the stale view's read in flight

    # --- before the AI is asked ------------------------------------------------------------
    async def admit(self) -> Admission:
        """Whether a turn may ask the AI now (see the module docstring)."""
        token, won = "", False
        try:
            pause = await self._read(fresh=False)
            if pause is None:
                return GO
            now = time.time()
            if now * 1000 < pause.until_ms:
                return self._wait(pause, now)
            # The pause is over: one worker asks again, the others wait for its answer.
            token = f"{self._worker_id}:{secrets.token_hex(4)}"
            won = await self._redis.set(self._probe_key, token, nx=True, px=self._probe_ms)
            pause, now = await self._read(fresh=True), time.time()
            if pause is None or now * 1000 < pause.until_ms:
                if won:
                    await self._release(token)
                return GO if pause is None else self._wait(pause, now)
            if not won:
                return Admission(self._recheck_s(), f"another worker is probing: {pause.why}")
            log.info(
                "AI pause over after %.0fs: this worker asks the AI again (level %d)",
                now - pause.since_ms / 1000,
                pause.level,
            )
            return Admission(probe=token)
        except _REDIS_ERRORS as exc:
            log.warning("could not read the AI pause, calling the AI: %r", exc)
            if won:
                await self._release(token)
            return GO

    async def gate(self) -> Admission:
        """`admit()`, raising AIPaused when the batch must wait."""
        if self._known is None and time.monotonic() - self._read_at < REFRESH_S:
            return GO  # nearly every turn: no pause, and a fresh view of it (`_read`)
        admission = await self.admit()
        if admission.wait_s > 0:
            raise AIPaused(admission.wait_s, f"waiting for the AI: {admission.why}")
        return admission

    async def ask(self, admission: Admission, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` (the brain) for a turn `gate()` let through. An outage of the AI pauses
        the fleet and raises AIPaused (the batch waits); a probe that gets an answer lifts the
        pause, one that ends in another error gives its token back."""
        try:
            answer = await call()
        except AIUnavailable as exc:
            raise AIPaused(await self.failed(exc, admission), exc.detail) from exc
        except BaseException:  # a cancelled turn too: the next batch due probes at once
            await self.release(admission)
            raise
        if admission.probe:  # only a probe has anything to do (`answered`)
            await self.answered(admission)
        return answer

    # --- after the AI answered or failed ----------------------------------------------------
    async def failed(self, error: AIUnavailable, admission: Admission) -> float:
        """The AI failed as a whole for a turn let through with `admission`: pause the fleet
        (or keep the pause another worker set). Returns how long the batch waits."""
        now = time.time()
        try:
            current = await self._read(fresh=True)
            if current is not None and not admission.probe:
                # In flight when another worker paused, or started on a stale view of it.
                if now * 1000 < current.until_ms:
                    return self._wait(current, now).wait_s
                return self._recheck_s()
            pause = self._next(current, error, now)
            # The key outlives the pause by the longest pause: the level is remembered.
            px = max(1, pause.until_ms - int(now * 1000)) + int(self._max_s * 1000)
            await self._redis.set(self._key, pause.to_json(), px=px)
            self._remember(pause)
            log.warning(
                "AI unavailable: the fleet pauses AI calls for %.1fs (level %d, retry-after %s,"
                " outage for %.0fs): %s",
                pause.until_ms / 1000 - now,
                pause.level,
                "-" if error.retry_after_s is None else f"{error.retry_after_s:g}s",
                now - pause.since_ms / 1000,
                error.detail,
            )
            # This batch is the next probe: due when the pause ends, without a jitter.
            return self._wait(pause, now, jitter=False).wait_s
        except _REDIS_ERRORS as exc:
            log.warning("could not store the AI pause: %r", exc)
            return self._length(1, error.retry_after_s) + self._jitter_s()
        finally:
            if admission.probe:  # after the new pause is stored (see the module docstring)
                await self._release(admission.probe)

    async def answered(self, admission: Admission) -> None:
        """The AI answered a turn let through with `admission`: a probe lifts the pause."""
        if not admission.probe:
            return
        try:
            pause = await self._read(fresh=True)
            await self._redis.delete(self._key)
            self._remember(None)
            if pause is not None:
                log.warning(
                    "AI answers again: pause lifted after an outage of %.0fs (level %d)",
                    time.time() - pause.since_ms / 1000,
                    pause.level,
                )
        except _REDIS_ERRORS as exc:
            log.warning("could not lift the AI pause: %r", exc)
        await self._release(admission.probe)

    async def release(self, admission: Admission) -> None:
        """The turn ended without a verdict on the AI (another error): a probe gives its token
        back, so the next batch due probes at once."""
        if admission.probe:
            await self._release(admission.probe)

    # --- helpers ------------------------------------------------------------------------------
    async def _read(self, *, fresh: bool) -> Pause | None:
        if fresh:
            self._remember(await self._get())
        elif time.monotonic() - self._read_at >= REFRESH_S:
            # One read for every turn that finds the view stale at once: 200 turns starting
            # together each sent their own GET (on a connection each) and cost ~7 % of the
            # worker's CPU per turn (docs/benchmarks/worker.md).
            if self._reading is None:
                self._reading = asyncio.ensure_future(self._refresh())
            await asyncio.shield(self._reading)
        return self._known

    async def _refresh(self) -> None:
        try:
            self._remember(await self._get())
        finally:
            self._reading = None

    async def _get(self) -> Pause | None:
        return Pause.parse(await self._redis.get(self._key))

    def _remember(self, pause: Pause | None) -> None:
        self._known, self._read_at = pause, time.monotonic()

    async def _release(self, token: str) -> None:
        """Delete the probe token if it is still ours (GET then DEL: the token outlives the
        probe's call, so it cannot have expired and gone to another worker in between unless
        the call outlived `AI_TIMEOUT_S`, and then two probes is the worst case)."""
        try:
            held = await self._redis.get(self._probe_key)
            if held is not None and (held.decode() if isinstance(held, bytes) else held) == token:
                await self._redis.delete(self._probe_key)
        except _REDIS_ERRORS as exc:
            log.warning("could not release the AI probe token (it expires): %r", exc)

    def _next(self, current: Pause | None, error: AIUnavailable, now: float) -> Pause:
        level = current.level + 1 if current is not None else 1
        length = self._length(level, error.retry_after_s)
        return Pause(
            until_ms=int((now + length) * 1000),
            level=level,
            since_ms=current.since_ms if current is not None else int(now * 1000),
            why=error.detail[:300],
            by=self._worker_id,
        )

    def _length(self, level: int, retry_after_s: float | None) -> float:
        """The pause after `level` failures in a row: doubling from `AI_OUTAGE_PAUSE_S`, a
        jitter on top, capped at `AI_OUTAGE_MAX_PAUSE_S`; never shorter than the provider's
        retry-after (one beyond the cap is the pause, exactly)."""
        backoff = self._first_s * 2.0 ** min(level - 1, 30)
        asked = retry_after_s or 0.0
        wanted = max(backoff, asked) * self._rng.uniform(1.0, 1.0 + PAUSE_JITTER)
        return min(wanted, max(self._max_s, asked))

    def _wait(self, pause: Pause, now: float, *, jitter: bool = True) -> Admission:
        """A batch waits for the pause's end, plus its own jitter (unless it is the next
        probe), so the batches of the fleet do not all come due at one instant."""
        left = max(0.0, pause.until_ms / 1000 - now)
        spread = self._jitter_s() if jitter else 0.0
        return Admission(left + WAIT_MARGIN_S + spread, pause.why)

    def _jitter_s(self) -> float:
        return self._rng.uniform(0.0, self._first_s)

    def _recheck_s(self) -> float:
        """How long a batch waits while another worker's probe decides."""
        return self._rng.uniform(0.5, 1.0) * self._first_s
