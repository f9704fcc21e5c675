"""A run directory loses nothing: ``streamrl run`` twice, a failing start, --overwrite, a refusal.

The system test runs the CLI as a user types it (``python -m streamrl run``, the supervisor of
``make run``) with a step cap, so each run is a real one (Redis, learner, actor) that takes
seconds; the cheap tests stop before any process starts.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from dir_fingerprint import fingerprint

from streamrl.broker.password import PASSWORD_ENV
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


def small_run(demo_policy: str, demo_dataset: str, steps: int) -> list[str]:
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
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_runs_resume_and_a_failing_start_keeps_the_checkpoints_and_the_policy(
    tmp_path, demo_policy, demo_dataset, monkeypatch
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("the user's own file\n")
    (run_dir / "learner_steps.jsonl").write_text('{"step": 1, "version": 1}\n')
    secret = f"pw-{uuid.uuid4().hex}"
    # the Redis password as every role takes it (never on the command line)
    monkeypatch.setenv(PASSWORD_ENV, secret)

    # an older streamrl's steps (no marker of a run's directory): refused, nothing touched,
    # --overwrite too, saying what it would have removed
    before = fingerprint(run_dir)
    done = streamrl_run(run_dir, *small_run(demo_policy, demo_dataset, 2), cwd=tmp_path)
    assert done.returncode == 2 and ".streamrl-run" in done.stderr, done.stderr[-2000:]
    assert "learner_steps.jsonl" in done.stderr and fingerprint(run_dir) == before
    done = streamrl_run(
        run_dir, "--overwrite", *small_run(demo_policy, demo_dataset, 2), cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "would have removed learner_steps.jsonl" in done.stderr
    assert fingerprint(run_dir) == before

    # the user moves the old steps away, as told; --overwrite then has nothing of a run's to remove
    (run_dir / "learner_steps.jsonl").unlink()
    done = streamrl_run(
        run_dir, "--overwrite", *small_run(demo_policy, demo_dataset, 2), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "notes.txt").read_text() == "the user's own file\n"
    assert [r["step"] for r in read_steps(run_dir)] == [1, 2]
    first_checkpoints = fingerprint(run_dir / "checkpoints")
    assert (run_dir / "checkpoints" / "latest").is_symlink()
    assert (run_dir / "policy" / "model.safetensors").is_file()

    # the same command again resumes: the steps go on, the first run's checkpoint stays
    done = streamrl_run(run_dir, *small_run(demo_policy, demo_dataset, 3), cwd=tmp_path)
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
    bad = small_run(str(tmp_path / "no-such-model"), demo_dataset, 4)
    done = streamrl_run(run_dir, *bad, cwd=tmp_path)
    assert done.returncode == 2 and "model.path" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert fingerprint(run_dir) == before
    assert not (tmp_path / "no-such-model").exists()

    # a run writes only the entries --overwrite may remove, all for its owner only
    assert {p.name for p in run_dir.iterdir()} - {"notes.txt"} <= RUN_ENTRIES
    for path in run_dir.rglob("*"):
        if path.name != "notes.txt" and not path.is_symlink():
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


# ----- trust, the marker, --overwrite (cheap: no process starts) ---------------------------------

OTHER_UID = 65534


def _as_other_user(path: Path) -> None:
    os.chown(path, OTHER_UID, OTHER_UID)


def _other_user_cases():
    """How another user's directory is made here: chown when root, else a mode others may write."""
    owner = pytest.param(
        _as_other_user,
        "owned by uid 65534",
        marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root can chown to another uid"),
        id="owned-by-another-uid",
    )
    writable = pytest.param(lambda p: p.chmod(0o777), "writable by", id="others-may-write")
    group = pytest.param(lambda p: p.chmod(0o770), "writable by its group", id="group-may-write")
    return [owner, writable, group]


@pytest.mark.parametrize(("hand_over", "why"), _other_user_cases())
@pytest.mark.parametrize("where", ["run-dir", "parent"])
def test_a_run_dir_another_user_could_change_is_refused_before_anything_in_it_is_read(
    tmp_path, hand_over, why, where
):
    from streamrl.configs.errors import ConfigError
    from streamrl.launch import rundir

    parent = tmp_path / "shared"
    run_dir = parent / "run"
    run_dir.mkdir(parents=True, mode=0o700)
    # what the other user planted: a config naming their reward, a checkpoint of their pickle
    (run_dir / "config.yaml").write_text("reward: {functions: [{fn: evil:reward}]}\n")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest").symlink_to("/tmp")
    hand_over(run_dir if where == "run-dir" else parent)
    with pytest.raises(ConfigError, match=why) as err:
        rundir.prepare(run_dir)
    assert "another user could" in str(err.value)
    # an existing run dir below it too (resume): same
    with pytest.raises(ConfigError, match=why):
        rundir.prepare(run_dir, resume=True)
    assert not (run_dir / rundir.MARKER).exists()


def test_a_sticky_parent_like_tmp_and_a_private_clone_are_trusted_and_a_new_run_dir_is_0700(
    tmp_path,
):
    from streamrl.launch import rundir

    # /tmp's shape: everyone may write, sticky
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    # a clone in a directory only its owner may enter
    clone = sticky / "clone"
    clone.mkdir(mode=0o700)
    run_dir = clone / "runs" / "mine"
    assert rundir.prepare(run_dir).startswith("new run")
    for made in (run_dir, run_dir.parent):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made
    assert rundir.run_id(run_dir)
    shared = clone / "runs" / "shared"
    rundir.prepare(shared, shared_read=True)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755


def test_overwrite_removes_only_a_marked_run_dirs_entries_and_refuses_an_unmarked_one(tmp_path):
    from streamrl.configs.errors import ConfigError
    from streamrl.launch import rundir

    # an older streamrl's run dir, or a user's own folder: no marker
    old = tmp_path / "old"
    old.mkdir()
    for name in ("logs", "policy", "agent"):
        (old / name).mkdir()
        (old / name / "mine.txt").write_text("the user's\n")
    (old / "notes.txt").write_text("the user's\n")
    before = fingerprint(old)
    with pytest.raises(ConfigError, match="no .streamrl-run") as err:
        rundir.prepare(old, overwrite=True)
    assert "would have removed agent, logs, policy" in str(err.value)
    # a new run there would mix into them: refused the same way
    with pytest.raises(ConfigError, match="agent, logs, policy"):
        rundir.prepare(old)
    assert fingerprint(old) == before

    # a run's own directory: its entries go, the user's file stays, a new run id is written
    run_dir = tmp_path / "run"
    rundir.prepare(run_dir)
    first = rundir.run_id(run_dir)
    for name in ("logs", "agent", "checkpoints"):
        (run_dir / name).mkdir()
    (run_dir / "learner_steps.jsonl").write_text("{}\n")
    (run_dir / "notes.txt").write_text("the user's\n")
    said = rundir.prepare(run_dir, overwrite=True)
    assert "removed agent, checkpoints, learner_steps.jsonl, logs" in said
    assert sorted(p.name for p in run_dir.iterdir()) == [rundir.MARKER, "notes.txt"]
    assert rundir.run_id(run_dir) not in (None, first)

    # a symlinked run.dir is not followed by --overwrite
    link = tmp_path / "link"
    link.symlink_to(run_dir)
    with pytest.raises(ConfigError, match="symlink"):
        rundir.prepare(link, overwrite=True)


def test_latest_must_name_a_checkpoint_folder_beside_it(tmp_path):
    from streamrl.configs.errors import ConfigError
    from streamrl.launch import rundir

    run_dir = tmp_path / "run"
    rundir.prepare(run_dir)
    root = run_dir / "checkpoints"
    (root / "step-00000003.0").mkdir(parents=True)
    (root / "latest").symlink_to("step-00000003.0")
    assert rundir.checkpoint_step(run_dir) == 3
    elsewhere = tmp_path / "planted" / "step-00000009.0"
    elsewhere.mkdir(parents=True)
    for target in (str(elsewhere), "../../planted/step-00000009.0"):
        (root / "latest").unlink()
        (root / "latest").symlink_to(target)
        with pytest.raises(ConfigError, match="not at a checkpoint folder"):
            rundir.prepare(run_dir)


@pytest.mark.parametrize("name", ["..", ".", "a/b", "../x", ""])
def test_run_name_is_one_plain_name(name):
    from streamrl.configs import ConfigError, load_config

    with pytest.raises(ConfigError, match="run.name"):
        load_config(None, {"run.name": name}, env={})


def test_streamrl_writes_through_no_planted_link_and_not_at_a_predictable_temp_name(tmp_path):
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.configs import load_config, write_config

    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    cfg = load_config(None, {"run.dir": str(run_dir)}, env={})
    (run_dir / "config.yaml").symlink_to(victim)
    (run_dir / "redis.url.tmp").symlink_to(victim)
    write_config(cfg, run_dir / "config.yaml")
    EmbeddedRedis(cfg.broker, run_dir / "redis").write_url(run_dir / "redis.url")
    assert victim.read_text() == "the victim's\n"
    for name in ("config.yaml", "redis.url"):
        path = run_dir / name
        assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600, name
    # no temporary file left behind
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.yaml",
        "redis.url",
        "redis.url.tmp",
    ]


@pytest.mark.parametrize(
    ("shared_read", "mode", "dir_mode"), [(False, 0o600, 0o700), (True, 0o644, 0o755)]
)
def test_a_run_writes_its_logs_for_its_owner_only_unless_shared_read(
    tmp_path, shared_read, mode, dir_mode
):
    from streamrl.configs.runfiles import restrict_umask
    from streamrl.runtime.jsonl_log import JsonlLog

    before = os.umask(0o022)
    try:
        restrict_umask(shared_read)
        log = JsonlLog(tmp_path / "logs" / "steps.jsonl")
        log.write({"step": 1})
        log.close()
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "logs" / "steps.jsonl").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "logs").stat().st_mode) == dir_mode
    # a log path that is a link is refused, not appended through
    victim = tmp_path / "victim.txt"
    victim.write_text("")
    (tmp_path / "planted.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        JsonlLog(tmp_path / "planted.jsonl")
    assert victim.read_text() == ""
