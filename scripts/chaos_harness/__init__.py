"""The chaos suite's harness (issue 7): the product as real processes under injected faults.

`run_scenario(name, duration_s=...)` starts Redis with AOF, the Graph API and Messages API
stand-ins, a receiver and several workers (stack.py), drives many people writing in bursts
with duplicate deliveries (workload.py), injects the scenario's fault (scenarios.py), waits
for the system to drain, and checks every invariant from the stand-ins' records and Redis
(observe.py, checks.py). Used by tests/chaos and by `scripts/chaos --duration S`.
"""
