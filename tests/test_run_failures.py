"""A run that cannot go well stops and says why: a reward that keeps failing, a learner crash loop.

Both run ``python -m streamrl run`` (the supervisor of ``make run``) as a user would, with a
tiny step size; what they check is the exit code, the terminal's stderr, the step rows and
TensorBoard.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from streamrl.launch.status import Snapshot, read_steps
from streamrl.launch.view import live_table, plain_line

BAD_REWARD = """
def needs_level(messages, answer, **columns):
    return float(columns["level"])
"""


def streamrl_run(run_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "streamrl", "run", "--config", "demo_cpu", "--actors", "1",
         f"run.dir={run_dir}", f"run.name=fail-{uuid.uuid4().hex[:8]}", "run.max_time_s=0",
         "run.target_reward=0", "run.target_parts={}", "rollout.group_size=4",
         "learner.groups_per_step=2", "learner.minibatches=1", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_a_reward_failing_on_most_samples_is_reported_per_step_and_stops_the_run(
    tmp_path, demo_policy, demo_dataset
):
    (tmp_path / "bad.py").write_text(BAD_REWARD)
    run_dir = tmp_path / "run"
    done = streamrl_run(
        run_dir,
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        f"reward.functions=[{{fn: {tmp_path / 'bad.py'}:needs_level, name: level}}, {{fn: exact_match}}]",
        "reward.max_failing_steps=2",
        # every reward is 0: train the zero-variance groups anyway, so that each row is a step of
        # its own (an untrained batch's row keeps the last trained step's number)
        "algo.skip_zero_variance=false",
        "run.max_steps=50",
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "run failed: run stopped: reward 'level' failed on more than half" in done.stderr
    assert "reward.max_failing_steps=2" in done.stderr and "KeyError: 'level'" in done.stderr
    steps = read_steps(run_dir)
    assert len(steps) == 2
    assert [s["reward_failure_rate"] for s in steps] == [{"level": 1.0, "exact_match": 0.0}] * 2

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward_failure_rate/level")] == [
        (1, 1.0),
        (2, 1.0),
    ]
    assert [e.value for e in events.Scalars("reward_failure_rate/exact_match")] == [0.0, 0.0]

    # the terminal view shows each function's rate
    snap = Snapshot(at=0.0, version=2, last_step=steps[-1])
    assert "level:failed=100% exact_match:failed=0%" in plain_line(snap, 5.0)
    console = Console(width=120, record=True)
    console.print(live_table(snap, 5.0, []))
    shown = console.export_text()
    assert "level failed" in shown and "100%" in shown and "exact_match failed" in shown


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_a_learner_that_keeps_crashing_ends_the_run_with_its_last_traceback(
    tmp_path, demo_policy, demo_dataset
):
    # a policy folder whose tokenizer loads (the start checks pass) and whose weights do not
    broken = tmp_path / "broken-policy"
    shutil.copytree(demo_policy, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    done = streamrl_run(
        tmp_path / "run",
        f"model.path={broken}",
        f"data.path={demo_dataset}",
        "learner.max_crashes=2",
        "run.max_steps=5",
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "run failed: the learner crashed 2 times within 600 s" in done.stderr
    assert "learner.max_crashes=2" in done.stderr and "Traceback" in done.stderr
    log = (tmp_path / "run" / "logs" / "supervisor.log").read_text()
    assert log.count("learner restarted") == 1 and "not restarted" in log
