"""examples/slurm/multihost.sbatch under a real Slurm (tests/slurm_cluster.py): slurmctld on a
login host, a slurmd on each of the namespace hosts A, B and C.

The script is submitted as a user would: ``sbatch -p PARTITION`` and the environment variables its
header documents, nothing else. Its heterogeneous job puts the learner on A and B (A, SLURM_NODEID
0, runs the broker and holds global rank 0) and the actors on C. The first job reaches its step
count although a learner worker on B is SIGKILLed: torchrun restarts both nodes' ranks and they
resume from the checkpoint. A second job in the same run directory resumes where the first ended
and is ``scancel``ed: nothing of the run is left running on any host, nor in any host's /dev/shm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from netns_hosts import Host
from slurm_cluster import PARTITION, Cluster, available, cluster
from user_project import ROOT, user_project

from bench.chaos_checks import LearnerKill, version_violations
from streamrl.launch.status import read_steps
from streamrl.learner.checkpoint import latest, step_of

SBATCH = ROOT / "examples" / "slurm" / "multihost.sbatch"
PASSWORD = "slurm-test-password"
CHECKPOINT_EVERY = 2
MAX_STEPS = 6
# the daemons that stay on a node between jobs
DAEMONS = ("slurmd",)

why_not = available()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        why_not is not None and not os.environ.get("STREAMRL_REQUIRE_NETNS"),
        reason=f"a Slurm cluster needs: {why_not}",
    ),
]


def _wait(what: str, ok, timeout: float, check=lambda: None) -> None:
    """Poll ``ok`` until true; fail naming ``what`` (a hang guard, not a speed bound)."""
    deadline = time.monotonic() + timeout
    while not ok():
        check()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


def _processes(host: Host) -> dict[int, tuple[str, dict[str, str]]]:
    """Every process in ``host``'s network namespace: its command line and environment."""
    out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
    found = {}
    for pid in map(int, out.stdout.split()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)
        found[pid] = (cmdline, env)
    return found


def _learner_workers(host: Host) -> dict[int, dict[str, str]]:
    """The learner ranks torchrun started on ``host`` (not its agent): pid -> environment."""
    return {
        pid: env
        for pid, (cmdline, env) in _processes(host).items()
        if "streamrl.learner" in cmdline and "LOCAL_RANK" in env
    }


def _leftovers(c: Cluster, run_name: str) -> dict[str, list[str]]:
    """What the run left on each host: processes other than Slurm's daemon, its /dev/shm files."""
    left = {}
    for name, host in c.hosts.items():
        procs = [cmd for cmd, _ in _processes(host).values() if not cmd.startswith(DAEMONS)]
        shm = host.run(
            ["find", "/dev/shm", "-name", f"streamrl.{run_name}.*"], capture_output=True, text=True
        ).stdout.split()
        if procs or shm:
            left[name] = procs + shm
    return left


def _submit(c: Cluster, env: dict[str, str], cwd: Path) -> str:
    out = c.client(["sbatch", "--parsable", "-p", PARTITION, str(SBATCH)], env=env, cwd=cwd)
    return out.stdout.strip().split(";")[0]


def _ended(c: Cluster, job: str) -> bool:
    return not c.client(["squeue", "-h", "-j", job]).stdout.strip()


def _time_of(rows: list[dict], killed: LearnerKill) -> float:
    """When the first step after the kill was written, on the monotonic clock."""
    return time.monotonic() - (time.time() - rows[killed.rows_before]["time"])


def _latest_checkpoint(run_dir: Path) -> int:
    folder = latest(run_dir / "checkpoints")
    return 0 if folder is None else step_of(folder)


@pytest.mark.timeout(900)
def test_the_sbatch_trains_to_its_step_count_survives_a_killed_node_and_scancel_leaves_nothing(
    demo_policy, demo_dataset
):
    if why_not is not None:  # STREAMRL_REQUIRE_NETNS (CI) makes a missing capability a failure
        pytest.fail(f"a Slurm cluster needs: {why_not}")
    with cluster(("A", "B", "C")) as c:
        a, b = c.hosts["A"], c.hosts["B"]
        project, env = user_project(c.folder)
        run_dir = c.folder / "run"
        run_dir.mkdir(mode=0o700)
        run_name = f"slurm{os.getpid()}"
        overrides = [
            f"run.name={run_name}", "run.max_time_s=0", f"model.path={demo_policy}",
            f"data.path={demo_dataset}", f"learner.checkpoint_every={CHECKPOINT_EVERY}",
            "learner.lr_scheduler=constant", "learner.cpus=null", "actor.cpus=null",
            "actor.staggered_start=false",
        ]  # fmt: skip
        job_env = {
            **env,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "STREAMRL_REDIS_PASSWORD": PASSWORD,
            "CONFIG": "demo_cpu",
            "RUN_DIR": str(run_dir),
            "LEARNER_RANKS": "1",
            "ACTORS_PER_NODE": "2",
            "ACTOR_GPUS": "null",
        }

        def output() -> str:
            return "".join(
                f"\n--- {p.name}\n" + p.read_text(errors="replace")[-30000:]
                for p in sorted(project.glob("slurm-*.out"))
            )

        def running(job: str):
            def check() -> None:
                assert not _ended(c, job), f"job {job} ended ({c.job_state(job)}){output()}"

            return check

        started = time.monotonic()
        try:
            # 1. the job trains; a SIGKILLed learner rank on B is restarted by torchrun on both
            # nodes, which resume from the checkpoint and reach run.max_steps
            job = _submit(c, {**job_env, "EXTRA": " ".join([*overrides, f"run.max_steps={MAX_STEPS}"])}, project)
            _wait("a checkpoint", lambda: _latest_checkpoint(run_dir) >= CHECKPOINT_EVERY, 400,
                  running(job))  # fmt: skip
            ranks = {h.name: [e["RANK"] for e in _learner_workers(h).values()] for h in (a, b)}
            nodes = {h.name: [e["SLURM_NODEID"] for e in _learner_workers(h).values()] for h in (a, b)}
            assert nodes == {"A": ["0"], "B": ["1"]}, nodes
            assert ranks == {"A": ["0"], "B": ["1"]}, f"global rank 0 is not SLURM_NODEID 0: {ranks}"
            old = {**_learner_workers(a), **_learner_workers(b)}
            for pid in _learner_workers(b):
                os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            # once the old ranks are all gone, neither steps nor checkpoints of theirs can follow
            _wait("the old ranks' end", lambda: not any(map(psutil.pid_exists, old)), 120,
                  running(job))  # fmt: skip
            killed = LearnerKill(len(read_steps(run_dir)), _latest_checkpoint(run_dir))
            _wait("a restarted rank on B", lambda: _learner_workers(b), 120, running(job))
            restarts = [e.get("TORCHELASTIC_RESTART_COUNT") for e in _learner_workers(b).values()]
            _wait("the job's end", lambda: _ended(c, job), 400)
            first_job_s = time.monotonic() - started
            assert c.job_state(job) == "COMPLETED", output()
            rows = read_steps(run_dir)
            assert rows[-1]["step"] == MAX_STEPS, output()
            assert killed.checkpoint_step >= CHECKPOINT_EVERY
            # torchrun's own restart (its first try may fail: the peers' old ranks are still going)
            assert restarts and all(int(n) >= 1 for n in restarts), restarts
            assert not version_violations(rows, [killed])
            print(f"restarts {restarts}; recovery {_time_of(rows, killed) - killed_at:.0f} s")
            _wait("nothing left after the job", lambda: not _leftovers(c, run_name), 60)

            # 2. a second job resumes where the first ended; scancel ends every part of it
            job = _submit(c, {**job_env, "EXTRA": " ".join(overrides)}, project)
            _wait("a step of the second job", lambda: read_steps(run_dir)[-1]["step"] > MAX_STEPS,
                  400, running(job))  # fmt: skip
            # the second job resumes from the first one's last checkpoint, at run.max_steps
            assert not version_violations(read_steps(run_dir), [LearnerKill(len(rows), MAX_STEPS)])
            c.client(["scancel", job])
            _wait("the cancelled job's end", lambda: _ended(c, job), 120)
            _wait("nothing left after scancel", lambda: not _leftovers(c, run_name), 60)
            print(f"first job {first_job_s:.0f} s, both {time.monotonic() - started:.0f} s")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{output()}\n{c.logs()}\n{_leftovers(c, run_name)}") from None
