"""bench.cpu_placement: its section from measured runs (the runs themselves are the benchmark)."""

from __future__ import annotations

import json

import pytest

from bench.cpu_placement import WARMUP, report, steady_state


def test_the_section_reports_each_run_and_the_ratio_of_the_medians():
    def run(interval: float) -> dict:
        return {"interval_ms": interval, "step_ms": interval - 10, "wait_ms": 2.0,
                "samples_per_s": 256_000 / interval, "steps": 120}  # fmt: skip

    runs = [("pinned", run(150)), ("unpinned", run(180)), ("unpinned", run(200)),
            ("pinned", run(160)), ("pinned", run(140)), ("unpinned", run(190))]  # fmt: skip
    text = report(runs, 0.5, "python -m bench.cpu_placement --pairs 3", 2)
    assert "| 2 | pinned | 160 | 150 | 2 | 1,600 |" in text
    assert "pinned / unpinned: 0.79x** (medians 150 and 190 ms)" in text
    assert "`python -m bench.cpu_placement --pairs 3`" in text


def test_the_steady_state_leaves_out_the_first_steps_and_takes_medians(tmp_path):
    steps = tmp_path / "learner_steps.jsonl"
    rows = [
        {
            "time": 0.2 * i + (100.0 if i < WARMUP else 0.0),
            "step_s": 0.15,
            "wait_s": 0.01,
            "samples": 256,
        }  # fmt: skip
        for i in range(WARMUP + 11)
    ]
    steps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = steady_state(steps)
    assert got["steps"] == 11
    # float64 round-off of a few units in the last place, nothing else
    assert got["interval_ms"] == pytest.approx(200.0, rel=1e-12)
    assert got["samples_per_s"] == pytest.approx(1280.0, rel=1e-12)
    assert got["step_ms"] == pytest.approx(150.0, rel=1e-12)
    assert got["wait_ms"] == pytest.approx(10.0, rel=1e-12)
