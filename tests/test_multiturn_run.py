"""A multi-turn run reports what its trajectories did in each step row, TensorBoard and the live
view: turns per trajectory, tool calls and their failures, environment step time and ends.

It runs ``python -m streamrl run`` (the supervisor of ``make run``) on the multi-turn demo with an
environment whose step raises on some rows, for two tiny steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from streamrl.broker import env_stats
from streamrl.launch.status import Snapshot, read_steps
from streamrl.launch.view import live_table, plain_line

ROOT = Path(__file__).resolve().parents[1]
# answers starting with an even digit make multiturn_envs.Flaky's step raise
ROWS = ["123", "214", "305", "436"]


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_turns_tool_calls_step_time_and_ends_reach_step_rows_tensorboard_and_the_view(
    tmp_path, multiturn_policy
):
    policy = multiturn_policy
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{n}>", "answer": n[::-1]}) + "\n" for n in ROWS)
    )
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "streamrl", "run", "--config",
         str(ROOT / "examples" / "multiturn" / "config.yaml"), "--actors", "1",
         f"run.dir={run_dir}", f"run.name=mt-{uuid.uuid4().hex[:8]}", "run.max_time_s=0",
         "run.max_steps=2", "run.target_parts={}", f"model.path={policy}", f"data.path={data}",
         "env.name=multiturn_envs:Flaky", "rollout.group_size=4", "learner.groups_per_step=4",
         "learner.minibatches=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_steps(run_dir)
    assert len(steps) == 2
    for row in steps:
        stats = row["env"]
        assert set(stats) == {
            "turns",
            "tool_calls",
            "step_s",
            *(f"tool_failed/{r}" for r in env_stats.TOOL_FAILURES),
            *(f"end/{r}" for r in env_stats.END_REASONS),
        }
        # one turn, or two after a wrong first answer; every trajectory ends once
        assert 1 <= stats["turns"] <= 2
        assert sum(stats[f"end/{r}"] for r in env_stats.END_REASONS) == pytest.approx(1.0)
        # each of the 4 rows once per step: the two with an even first answer digit raise
        assert stats["end/error"] == pytest.approx(0.5) and stats["end/done"] == pytest.approx(0.5)
        # the demo's model writes no tool calls
        assert stats["tool_calls"] == 0 and stats["tool_failed/raised"] == 0
        assert 0 < stats["step_s"] < 10

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for name in ("env/turns", "env/step_s", "env/end/error", "env/tool_failed/parse"):
        assert [e.step for e in events.Scalars(name)] == [1, 2]
    assert [e.value for e in events.Scalars("env/end/error")] == pytest.approx([0.5, 0.5])

    snap = Snapshot(at=0.0, version=2, last_step=steps[-1])
    assert f"turns={steps[-1]['env']['turns']:.2f} env_step=" in plain_line(snap, 5.0)
    console = Console(width=120, record=True)
    console.print(live_table(snap, 5.0, []))
    assert "turns / trajectory" in console.export_text()
