"""streamrl runs from a user's own project directory, whatever packages that directory holds.

Every process streamrl starts puts its working directory first on ``sys.path``; an ML repository
often has packages called ``configs``, ``learner``, ``actors`` or ``launch`` of its own. Here each
of those raises on import, so any streamrl module still importing a bare top-level name fails the
run. The run starts as a user starts it: the console script, the preset by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.launch.status import read_steps

ROOT = Path(__file__).resolve().parents[1]
USER_PACKAGES = ("configs", "learner", "actors", "launch", "broker", "weightsync", "policy")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_started_in_a_directory_with_its_own_configs_learner_and_actors_trains(
    tmp_path, demo_policy, demo_dataset
):
    project = tmp_path / "my_project"
    for name in USER_PACKAGES:
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(
            f"raise ImportError('the user project\\'s own {name} package was imported')\n"
        )
    run_dir = tmp_path / "run"
    # Only the `streamrl` of the checkout under test is importable, not its top-level folders:
    # ROOT on sys.path would let a bare `import configs` find the real one.
    importable = tmp_path / "importable"
    importable.mkdir()
    (importable / "streamrl").symlink_to(ROOT / "streamrl")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = str(importable)
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
    assert "user project" not in result.stderr + logs
    steps = read_steps(run_dir)
    assert steps and steps[-1]["step"] >= 3, result.stdout[-2000:] + logs
    assert any(steps[i]["groups_by_actor"] for i in range(len(steps)))
