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
from slurm_cluster import PARTITION, Cluster, cluster, require
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

pytestmark = pytest.mark.slow


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


class Job:
    """The sbatch submitted from the user's project on the login host, with ``environ``."""

    def __init__(self, c: Cluster, project: Path, environ: dict[str, str]):
        self.c, self.project = c, project
        argv = ["sbatch", "--parsable", "-p", PARTITION, str(SBATCH)]
        self.id = c.client(argv, env=environ, cwd=project).stdout.strip().split(";")[0]

    def ended(self) -> bool:
        return not self.c.client(["squeue", "-h", "-j", self.id]).stdout.strip()

    def running(self) -> None:
        assert not self.ended(), f"job {self.id} ended ({self.c.job_state(self.id)})"

    def output(self) -> str:
        """The job's output (every job's: they share the project folder)."""
        return "".join(
            f"\n--- {p.name}\n" + p.read_text(errors="replace")[-30000:]
            for p in sorted(self.project.glob("slurm-*.out"))
        )


def _recovery_s(rows: list[dict], killed: LearnerKill) -> float:
    """Seconds between the last step before the kill and the first trained one after it."""
    after = next(r for r in rows[killed.rows_before :] if r.get("trained", True))
    return after["time"] - rows[killed.rows_before - 1]["time"]


def _latest_checkpoint(run_dir: Path) -> int:
    folder = latest(run_dir / "checkpoints")
    return 0 if folder is None else step_of(folder)


def _kill_learner_node_b(c: Cluster, job: Job, run_dir: Path) -> tuple[LearnerKill, list[str]]:
    """SIGKILL B's learner ranks once global rank 0 is on SLURM_NODEID 0 (A): what was saved
    when the old ranks were all gone, and the restart count of B's new ranks."""
    a, b = c.hosts["A"], c.hosts["B"]
    placed = {
        h.name: sorted((e["SLURM_NODEID"], e["RANK"]) for e in _learner_workers(h).values())
        for h in (a, b)
    }
    assert placed == {"A": [("0", "0")], "B": [("1", "1")]}, f"(SLURM_NODEID, RANK): {placed}"
    old = {**_learner_workers(a), **_learner_workers(b)}
    for pid in _learner_workers(b):
        os.kill(pid, signal.SIGKILL)
    # once the old ranks are all gone, neither steps nor checkpoints of theirs can follow
    _wait("the old ranks' end", lambda: not any(map(psutil.pid_exists, old)), 120, job.running)
    killed = LearnerKill(len(read_steps(run_dir)), _latest_checkpoint(run_dir))
    _wait("a restarted rank on B", lambda: _learner_workers(b), 120, job.running)
    return killed, [e.get("TORCHELASTIC_RESTART_COUNT", "0") for e in _learner_workers(b).values()]


@pytest.mark.timeout(900)
def test_the_sbatch_trains_to_its_step_count_survives_a_killed_node_and_scancel_leaves_nothing(
    demo_policy, demo_dataset
):
    require()
    with cluster(("A", "B", "C")) as c:
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
        # the sbatch's header documents these; the rest of its defaults are for GPU nodes
        environ = {
            **env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "STREAMRL_REDIS_PASSWORD": PASSWORD, "CONFIG": "demo_cpu", "RUN_DIR": str(run_dir),
            "LEARNER_RANKS": "1", "ACTORS_PER_NODE": "2", "ACTOR_GPUS": "null",
        }  # fmt: skip
        started = time.monotonic()
        job = None
        try:
            # 1. it trains; B's SIGKILLed rank is restarted by torchrun (so are A's), the ranks
            # resume from the checkpoint and reach run.max_steps; the job then ends cleanly
            extra = " ".join([*overrides, f"run.max_steps={MAX_STEPS}"])
            job = Job(c, project, {**environ, "EXTRA": extra})
            _wait("a checkpoint", lambda: _latest_checkpoint(run_dir) >= CHECKPOINT_EVERY, 400,
                  job.running)  # fmt: skip
            killed, restarts = _kill_learner_node_b(c, job, run_dir)
            _wait("the job's end", job.ended, 400)
            first_s = time.monotonic() - started
            assert c.job_state(job.id) == "COMPLETED"
            rows = read_steps(run_dir)
            assert rows[-1]["step"] == MAX_STEPS
            assert killed.checkpoint_step >= CHECKPOINT_EVERY
            # torchrun's own restart (its first try may fail: the peers' old ranks still run)
            assert restarts and all(int(n) >= 1 for n in restarts), restarts
            assert not version_violations(rows, [killed])
            _wait("nothing left after the job", lambda: not _leftovers(c, run_name), 60)

            # 2. a second job resumes where the first ended; scancel ends every part of it
            job = Job(c, project, {**environ, "EXTRA": " ".join(overrides)})
            _wait("a step of the second job", lambda: read_steps(run_dir)[-1]["step"] > MAX_STEPS,
                  400, job.running)  # fmt: skip
            assert not version_violations(read_steps(run_dir), [LearnerKill(len(rows), MAX_STEPS)])
            c.client(["scancel", job.id])
            _wait("the cancelled job's end", job.ended, 120)
            _wait("nothing left after scancel", lambda: not _leftovers(c, run_name), 60)
            gap = _recovery_s(rows, killed)
            print(f"first job {first_s:.0f} s (restart {restarts}, {gap:.0f} s between steps), "
                  f"both jobs {time.monotonic() - started:.0f} s")  # fmt: skip
        except AssertionError as exc:
            said = job.output() if job else ""
            raise AssertionError(f"{exc}\n{said}\n{c.logs()}\n{_leftovers(c, run_name)}") from None
