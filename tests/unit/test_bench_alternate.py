"""scripts/bench/alternate.py reads bench_worker's table back and compares two revisions by
medians and pairs won; a report it cannot read is an error, not a zero."""

from __future__ import annotations

import pytest

from scripts.bench.alternate import read_run, summary

REPORT = """\
| measurement | runs | median | unit | target |
| --- | --- | --- | --- | --- |
| 2. baseline: LPUSH/RPOP pairs/s, 1 client, pipelines of 200 | 47,814 | 47,814 | /s |  |
| 2. throughput, 1 process | 11,677 | 11,677 | turns/s | >= 5000: met |
| 2. worker CPU per turn | 55.3 | 55.3 | µs |  |
| 2. Redis CPU per turn | 64.8 | 64.8 | µs |  |
| 2. throughput, 2 processes | 14,252 | 14,252 | turns/s |  |
| 2. anchor: BullMQ, 1 process, no-op jobs | 24,341 | 24,341 | jobs/s |  |
| 2. throughput, 1 process ÷ BullMQ | 0.48 | 0.48 | × |  |
"""


def test_a_report_is_read_by_the_rows_names() -> None:
    assert read_run(REPORT) == {
        "turns/s, 1 process": 11677.0,
        "worker µs a turn": 55.3,
        "Redis µs a turn": 64.8,
        "turns/s, 2 processes": 14252.0,
        "BullMQ jobs/s": 24341.0,
        "÷ BullMQ": 0.48,
    }


def test_a_run_without_anchors_leaves_them_out() -> None:
    without = "\n".join(line for line in REPORT.splitlines() if "BullMQ" not in line)
    assert set(read_run(without)) == {
        "turns/s, 1 process",
        "worker µs a turn",
        "Redis µs a turn",
        "turns/s, 2 processes",
    }


def test_a_report_of_several_runs_is_refused() -> None:
    several = REPORT.replace("| 11,677 | 11,677 |", "| 11,677 / 12,001 | 11,839 |")
    with pytest.raises(ValueError, match="not one run's number"):
        read_run(several)


def test_the_summary_gives_medians_ranges_and_pairs_won_the_right_way_round() -> None:
    runs = {
        "A": [
            {"turns/s, 1 process": 10.0, "worker µs a turn": 50.0},
            {"turns/s, 1 process": 12.0, "worker µs a turn": 60.0},
            {"turns/s, 1 process": 11.0, "worker µs a turn": 55.0},
        ],
        "B": [
            {"turns/s, 1 process": 11.0, "worker µs a turn": 49.0},
            {"turns/s, 1 process": 11.0, "worker µs a turn": 61.0},
            {"turns/s, 1 process": 13.0, "worker µs a turn": 55.0},
        ],
    }
    table = summary(["A", "B"], runs).splitlines()
    assert table[0] == "| measured | A | B | pairs B won |"
    # B had more turns/s in pairs 1 and 3; less worker CPU (better) in pair 1, a tie in 3.
    assert table[2] == "| turns/s, 1 process | 11.00 (10.00-12.00) | 11.00 (11.00-13.00) | 2 of 3 |"
    assert table[3] == "| worker µs a turn | 55.00 (50.00-60.00) | 55.00 (49.00-61.00) | 1 of 3 |"
    assert len(table) == 4, "measurements no run had are left out"
