"""``python -m bench.gpu`` runs each check as a process of its own under its own timeout and loses
nothing it measured: a check's output is relayed line by line while it runs, a failing or
timed-out pytest check shows its test names and tracebacks, a timeout costs only that check, and
nothing a check started (in sessions of its own too) outlives it. A missing module is reported,
not fatal. Its ``--cpu`` dry run works without a GPU and prints the versions first."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.gpu import CHECKS, PYTEST_GPU, Check, passed, run_check

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def _check(module: str, *args: str, timeout_s: float = 60) -> Check:
    return Check("probe", module, args, args, timeout_s, 1.0, "a probe")


def test_a_module_not_in_the_tree_is_reported_missing_and_does_not_fail_the_run():
    result = run_check(_check("bench.no_such_check"), cpu=True, timeout_s=60)
    assert result.status == "module missing"
    assert passed([result])


def test_each_line_is_relayed_while_the_check_still_runs(tmp_path):
    """The check prints a row, then waits for a file that only the relay of that row creates
    before it prints the second: the second row comes only if the first was relayed at once."""
    flag = tmp_path / "seen"
    code = (
        "import pathlib, time; print('| row 1 |', flush=True); "
        f"seen = lambda: pathlib.Path({str(flag)!r}).exists(); "
        "[time.sleep(0.05) for _ in iter(seen, True)]; "
        "print('| row 2 |', flush=True)"
    )
    seen = []

    def echo(line: str) -> None:
        seen.append(line)
        if line.startswith("| row 1 |"):
            flag.touch()

    result = run_check(_check("timeit", "-n", "1", "-r", "1", code), True, 60, echo)
    assert result.status == "ok"
    assert seen[:2] == ["| row 1 |\n", "| row 2 |\n"]
    assert result.output.startswith("| row 1 |\n| row 2 |\n")


# runs in a process of its own that adopts orphans, as ``python -m bench.gpu`` does: a check
# that spawns a process in a new session (as the supervisor does), then fails or never ends
DRIVER = """
import json, sys
from bench.gpu import Check, run_all
from bench.process_tree import become_subreaper

spawn = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
         "'import time; time.sleep(600)'], start_new_session=True); "
         "print('grandchild', p.pid, flush=True); ")
checks = [
    Check("fails", "timeit", ("-n", "1", "-r", "1", spawn + "raise RuntimeError('forced')"), (), 60, 1, ""),
    Check("hangs", "timeit", ("-n", "1", "-r", "1", spawn + "p.wait()"), (), 8, 1, ""),
    Check("after", "timeit", ("-n", "1", "-r", "1", "print('| measured |')"), (), 60, 1, ""),
]
assert become_subreaper()
results = run_all(checks, cpu=False, budget_s=300, echo=lambda line: None)
print(json.dumps([[r.name, r.status, r.output] for r in results]))
"""


def test_a_failing_check_keeps_its_traceback_a_timeout_costs_only_its_check_and_nothing_survives():
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], cwd=ROOT, env=ENV, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = {name: (status, output) for name, status, output in json.loads(done.stdout)}
    grandchildren = [
        int(line.split()[1])
        for _, output in results.values()
        for line in output.splitlines()
        if line.startswith("grandchild ")
    ]
    survivors = [pid for pid in grandchildren if Path(f"/proc/{pid}").exists()]
    for pid in survivors:
        os.kill(pid, 9)
    assert len(grandchildren) == 2 and not survivors
    status, output = results["fails"]
    assert status == "failed (rc 1)"
    assert "Traceback" in output and "RuntimeError: forced" in output
    assert "1 processes of it still running, killed" in output
    # what it printed before its timeout is kept
    assert results["hangs"][0] == "timeout (8 s)" and "grandchild " in results["hangs"][1]
    assert results["after"][0] == "ok" and "| measured |" in results["after"][1]


def test_a_pytest_check_names_its_tests_and_shows_a_failures_traceback(tmp_path):
    tests = tmp_path / "test_probe.py"
    tests.write_text(
        textwrap.dedent("""
        def test_passes():
            pass

        def test_fails():
            assert 1 + 1 == 3, "forced"
        """)
    )
    check = Check("probe", "pytest", (*PYTEST_GPU, str(tests)), (), 60, 1.0, "")
    result = run_check(check, cpu=False, timeout_s=60, echo=lambda line: None)
    assert result.status == "failed (rc 1)"
    assert "test_probe.py::test_passes PASSED" in result.output
    assert "test_probe.py::test_fails FAILED" in result.output
    assert "AssertionError: forced" in result.output
    assert "FAILED " in result.output.split("short test summary info")[-1]


def test_the_timeouts_of_the_first_call_fit_its_budget():
    first = CHECKS[:5]
    assert [c.name for c in first] == [
        "ipc-tests", "publish-ipc-0.5b", "graph-tests", "decode-256", "varlen-tests",
    ]  # fmt: skip
    assert sum(c.timeout_s for c in first) <= 300
    assert sum(c.timeout_s for c in CHECKS[5:9]) <= 300


def test_every_pytest_checks_files_are_in_the_tree():
    """The pytest checks' CPU form (collection) is left out of the dry run below: make test
    collects the same files (they skip on CPU), and each collection costs a torch import."""
    for check in (c for c in CHECKS if c.module == "pytest"):
        files = [a for a in check.gpu_args if a.startswith("tests/")]
        assert files and all((ROOT / f).is_file() for f in files), check.name


@pytest.mark.slow
def test_the_cpu_dry_run_prints_versions_first_then_every_checks_rows(tmp_path):
    out = tmp_path / "out"
    measuring = [c for c in CHECKS if c.module != "pytest"]
    only = ",".join(c.name for c in measuring)
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--cpu", "--only", only, "--out-dir", str(out)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = done.stdout
    assert log.startswith("torch ") and " · transformers " in log.splitlines()[0]
    assert (out / "log.txt").read_text() in log
    table = (out / "summary.md").read_text()
    for check in measuring:
        present = importlib.util.find_spec(check.module) is not None
        assert f"| {check.name} | {'ok' if present else 'module missing'} |" in table
        assert f"== {check.name}: " in log
    # the publish check measured something at the tiny shape
    assert "| cpu | float32 |" in log
    # the decode check measured the hf engine and generate back to back: 4 slots x 6 tokens each
    runs = ("hf engine, static", "hf engine, dynamic", "generate, static cache")
    for run in (*runs, "generate, static cache, compiled"):
        row = next(line for line in log.splitlines() if line.startswith(f"| {run} |"))
        assert row.split("|")[2].strip() == "24", row
    assert "ratio hf engine, static / generate, static cache: " in log


def test_results_are_never_written_into_docs():
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--cpu", "--out-dir", "docs/bench"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "not under docs/" in done.stderr
