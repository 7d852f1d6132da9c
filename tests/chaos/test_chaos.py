"""The chaos suite, short: each scenario of scripts/chaos_harness for a few seconds of traffic.

Real processes: Redis with AOF (`appendfsync always`), the Graph API and Messages API
stand-ins, a receiver on uvicorn and three `python -m worker` processes running the real
`anthropic` brain and `whatsapp` sender. Many people write in bursts with 20% duplicate
deliveries while the scenario's fault is injected; after the system drained every invariant
is checked (scripts/chaos_harness/checks.py) and so is the fault's own effect. A violation
fails the test naming the invariant and the person. `scripts/chaos --duration S` runs the
same scenarios for longer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.chaos_harness.scenarios import SCENARIOS, run_scenario

pytestmark = pytest.mark.slow

DURATION_S = 4.0
PEOPLE = 20


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_scenario_keeps_every_invariant(name: str, tmp_path: Path) -> None:
    report = await run_scenario(name, duration_s=DURATION_S, people=PEOPLE, run_dir=tmp_path)
    print(report.summary())  # shown by pytest when the test fails
    assert report.ok, f"{report.summary()}\n{report.logs[-6000:]}"
    figures = report.figures
    # The run did what a chaos run is for: many messages, duplicates, bursts held to one turn.
    assert figures["acknowledged"] == figures["messages"] >= 3 * PEOPLE
    assert figures["duplicate_deliveries"] > 0
    assert figures["bursts_held_to_one_turn"] > 0
    assert figures["batches_answered"] > 0
