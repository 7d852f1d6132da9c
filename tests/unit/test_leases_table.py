"""The table of this process's running turns (worker/fleet/leases.py), as pure logic.

A turn's task may outlive its finish by a little bookkeeping (its figures); by then the
person's next batch can already be claimed by this same worker. Ending the first turn must not
drop the second one's entry: its lease would no longer be renewed, another worker would take
the batch over mid-turn, and two turns of one person would run at once (invariant 3). The chaos
suite's slow_ai scenario found this.
"""

from __future__ import annotations

from shared.conversation.batch import Batch
from shared.settings import Settings
from worker.fleet.leases import Leases


def batch(batch_id: str, person: str = "5491155550001") -> Batch:
    return Batch(
        tenant="106540352242922",
        person=person,
        id=batch_id,
        token=f"token-{batch_id}",
        attempt=0,
        claimed_ms=0,
        due_ms=0,
        requeued=False,
        messages=[],
    )


def test_ending_a_turn_keeps_the_next_turn_of_the_same_person() -> None:
    leases = Leases(Settings())
    first, second = batch("b1"), batch("b2")
    leases.add(first, loop_now=0.0)
    leases.add(second, loop_now=1.0)  # claimed once the first's finish released the lock
    leases.remove(first)  # the first turn's task ends after its bookkeeping
    assert len(leases) == 1
    leases.remove(second)
    assert len(leases) == 0


def test_a_retried_batch_is_a_new_turn_of_its_own() -> None:
    leases = Leases(Settings())
    attempt_1, attempt_2 = batch("b1"), batch("b1")  # same id, claimed again after a retry
    leases.add(attempt_1, loop_now=0.0)
    leases.add(attempt_2, loop_now=5.0)
    leases.remove(attempt_1)
    assert len(leases) == 1


def test_other_people_are_untouched() -> None:
    leases = Leases(Settings())
    mine, theirs = batch("b1"), batch("b2", person="5491155550002")
    leases.add(mine, loop_now=0.0)
    leases.add(theirs, loop_now=0.0)
    leases.remove(mine)
    assert len(leases) == 1
