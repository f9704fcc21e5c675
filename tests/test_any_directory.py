"""streamrl runs from a user's own project directory, whatever packages that directory holds
(tests/user_project.py). The run starts as a user starts it: the console script, the preset by name. Where network
namespaces can be made (root, as in CI), tests/test_multihost.py runs every role from such a
project too, and this test, one more whole run, is skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from netns_hosts import available
from user_project import IMPORTED, user_project

from streamrl.launch.status import read_steps


@pytest.mark.slow
@pytest.mark.skipif(available() is None, reason="tests/test_multihost.py runs from a user project")
@pytest.mark.timeout(300)
def test_a_run_started_in_a_directory_with_its_own_configs_learner_and_actors_trains(
    tmp_path, demo_policy, demo_dataset
):
    project, env = user_project(tmp_path)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "streamrl"), "run",
            "--config", "demo_cpu",
            "--actors", "1",
            f"run.dir={run_dir}",
            f"model.path={demo_policy}",
            f"data.path={demo_dataset}",
            "run.max_steps=3",
            "run.max_time_s=0",
        ],
        cwd=project, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    logs = "".join(p.read_text()[-1500:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:] + logs
    assert IMPORTED not in result.stderr + logs
    steps = read_steps(run_dir)
    assert steps and steps[-1]["step"] >= 3, result.stdout[-2000:] + logs
    assert any(steps[i]["groups_by_actor"] for i in range(len(steps)))
