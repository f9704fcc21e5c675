"""A run directory loses nothing: ``streamrl run`` twice, a failing start, --overwrite, a refusal.

The system test runs the CLI as a user types it (``python -m streamrl run``, the supervisor of
``make run``) with a step cap, so each run is a real one (Redis, learner, actor) that takes
seconds; the cheap tests stop before any process starts.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from streamrl.launch.rundir import RUN_ENTRIES
from streamrl.launch.status import read_steps


def streamrl_run(
    run_dir: Path, *args: str, cwd: Path, config: str = "demo_cpu"
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "streamrl", "run", "--config", config, "--actors", "1",
         f"run.dir={run_dir}", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (symlinks by target) with a hash of its bytes."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def small_run(demo_policy: str, demo_dataset: str, steps: int, secret: str) -> list[str]:
    return [
        f"run.name=rundir-{uuid.uuid4().hex[:8]}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        f"run.max_steps={steps}",
        "run.max_time_s=0",
        "run.target_reward=0",
        "run.target_parts={}",
        "rollout.group_size=4",
        "learner.groups_per_step=2",
        "learner.minibatches=1",
        # a checkpoint at shutdown only
        "learner.checkpoint_every=1000",
        f"broker.password={secret}",
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_runs_resume_and_a_failing_start_keeps_the_checkpoints_and_the_policy(
    tmp_path, demo_policy, demo_dataset
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("the user's own file\n")
    (run_dir / "learner_steps.jsonl").write_text('{"step": 1, "version": 1}\n')
    secret = f"pw-{uuid.uuid4().hex}"

    # an earlier run's steps without a checkpoint: refused, nothing touched
    before = fingerprint(run_dir)
    done = streamrl_run(run_dir, *small_run(demo_policy, demo_dataset, 2, secret), cwd=tmp_path)
    assert done.returncode == 2 and "--overwrite" in done.stderr, done.stderr[-2000:]
    assert "learner_steps.jsonl" in done.stderr and fingerprint(run_dir) == before

    # --overwrite removes what streamrl wrote there, and only that
    done = streamrl_run(
        run_dir, "--overwrite", *small_run(demo_policy, demo_dataset, 2, secret), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "notes.txt").read_text() == "the user's own file\n"
    assert [r["step"] for r in read_steps(run_dir)] == [1, 2]
    first_checkpoints = fingerprint(run_dir / "checkpoints")
    assert (run_dir / "checkpoints" / "latest").is_symlink()
    assert (run_dir / "policy" / "model.safetensors").is_file()

    # the same command again resumes: the steps go on, the first run's checkpoint stays
    done = streamrl_run(run_dir, *small_run(demo_policy, demo_dataset, 3, secret), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "resuming from the checkpoint of step 2"
        in (run_dir / "logs" / "supervisor.log").read_text()
    )
    assert [r["step"] for r in read_steps(run_dir)] == [1, 2, 3]
    second_checkpoints = fingerprint(run_dir / "checkpoints")
    kept = [k for k in first_checkpoints if k.startswith("step-") and k in second_checkpoints]
    assert kept and all(first_checkpoints[k] == second_checkpoints[k] for k in kept)
    assert (run_dir / "notes.txt").exists()

    # a start that fails (a model path that is nowhere) changes nothing there
    before = fingerprint(run_dir)
    # (the demo preset builds its policy where it is missing; a user's config has no such hook)
    bad = [*small_run(str(tmp_path / "no-such-model"), demo_dataset, 4, secret), "model.build=null"]
    done = streamrl_run(run_dir, *bad, cwd=tmp_path)
    assert done.returncode == 2 and "model.path" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert fingerprint(run_dir) == before
    assert not (tmp_path / "no-such-model").exists()

    # a run writes only the entries --overwrite may remove, and the secret only to 0600 files
    assert {p.name for p in run_dir.iterdir()} - {"notes.txt"} <= RUN_ENTRIES
    for path in run_dir.rglob("*"):
        if path.is_file() and not path.is_symlink() and secret.encode() in path.read_bytes():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert secret not in (run_dir / "config.yaml").read_text()


@pytest.mark.parametrize("missing", ["model.path", "data.path"])
def test_a_missing_model_or_dataset_fails_at_start_naming_the_key_and_creates_nothing(
    tmp_path, demo_policy, demo_dataset, missing
):
    paths = {"model": demo_policy, "data": demo_dataset}
    paths[missing.split(".")[0]] = str(tmp_path / "typo" / "nowhere.jsonl")
    # a user's config: a model, a dataset and a reward
    (tmp_path / "mine.yaml").write_text(
        f"model:\n  path: {paths['model']}\ndata:\n  path: {paths['data']}\n"
        "reward:\n  functions:\n    - fn: exact_match\n"
    )
    done = streamrl_run(tmp_path / "run", cwd=tmp_path, config="mine.yaml")
    assert done.returncode == 2, done.stderr[-2000:]
    assert missing in done.stderr and "Traceback" not in done.stderr
    # no demo stood in, and no run directory was begun
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


def test_resume_without_a_checkpoint_and_a_live_run_are_refused(tmp_path):
    from streamrl.configs.errors import ConfigError
    from streamrl.launch import rundir

    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        rundir.prepare(tmp_path / "run", resume=True)
    with pytest.raises(ConfigError, match="contradict"):
        rundir.prepare(tmp_path / "run", resume=True, overwrite=True)
    # a supervisor still running there: its run.json names a live process of streamrl's
    (tmp_path / "run").mkdir()
    live = subprocess.Popen(
        [sys.executable, "-c", "import time; print(flush=True); time.sleep(120)", "streamrl"],
        stdout=subprocess.PIPE,
    )
    try:
        # started (its command line in /proc) once it prints
        live.stdout.readline()
        (tmp_path / "run" / "run.json").write_text(f'{{"supervisor_pid": {live.pid}}}')
        with pytest.raises(ConfigError, match=f"still running there .*pid {live.pid}"):
            rundir.prepare(tmp_path / "run", overwrite=True)
    finally:
        live.kill()
        live.wait()
    assert (tmp_path / "run" / "run.json").exists()
