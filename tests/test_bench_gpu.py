"""``python -m bench.gpu`` runs each check as a process of its own under its own timeout and sums
up: a missing module is reported, not fatal; a failure or a timeout is, and a check that runs out
its time is killed with its whole process group. Its ``--cpu`` smoke run works without a GPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from bench.gpu import CHECKS, Check, passed, run_check

ROOT = Path(__file__).resolve().parents[1]


def _check(module: str, *args: str, timeout_s: float = 60) -> Check:
    return Check("probe", module, args, args, timeout_s, "a probe")


def test_a_module_not_in_the_tree_is_reported_missing_and_does_not_fail_the_run():
    result = run_check(_check("bench.no_such_check"), cpu=True, timeout_s=60)
    assert result.status == "module missing"
    assert passed([result])


def test_a_failing_check_fails_the_run():
    result = run_check(_check("timeit", "-n", "1", "raise SystemExit(3)"), cpu=True, timeout_s=60)
    assert result.status.startswith("failed (rc ")
    assert not passed([result])


def test_a_check_that_never_ends_is_killed_at_its_timeout():
    # blocks forever: only the timeout can end it
    forever = _check("timeit", "-n", "1", "import threading; threading.Event().wait()")
    result = run_check(forever, cpu=True, timeout_s=2)
    assert result.status == "timeout (2 s)"
    assert not passed([result])


def test_the_cpu_smoke_run_runs_every_present_check_and_names_the_missing_ones(tmp_path):
    out = tmp_path / "gpu.md"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--cpu", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = out.read_text()
    for check in CHECKS:
        present = importlib.util.find_spec(check.module) is not None
        assert f"| {check.name} | {'ok' if present else 'module missing'} |" in table
    # the publish check measured something at the tiny shape
    assert "| cpu | float32 |" in table
    # the decode check measured the hf engine and generate back to back: 4 slots x 6 tokens each
    for run in ("hf engine, static", "hf engine, dynamic", "generate, static cache"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {run} |"))
        assert row.split("|")[2].strip() == "24", row
    assert "ratio hf engine (static) / generate (static cache): " in table
