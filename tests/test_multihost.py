"""Three hosts in network namespaces (tests/netns_hosts.py), each role started by its own command,
as docs/multihost.md and the README's multi-host section show them:

- host A: ``streamrl broker`` on A's address, learner node 0, and one actor (reading the learner's
  own shared memory);
- host B: learner node 1 (gloo through torchrun's c10d rendezvous at A);
- host C: ``streamrl actors --join redis://A:6379/0 --count 2``: two supervised actors and the
  host relay, which takes each weight version once over the link and serves both actors from
  shared memory.

One run, several properties, because starting it is the expensive part: it trains and C's
versions advance; a version crosses C's link once, not once per actor; a SIGKILLed actor on C
comes back and catches up; C unplugged longer than ``weightsync.timeout_s`` does not stop the
learner, and C resumes when plugged back; a killed learner node stops both nodes, and the two
learner commands started again resume from the last checkpoint; nothing accepted is lost or
trained twice. Every command runs from a user project whose own ``configs``, ``learner``,
``actors``... packages would break any bare import of streamrl's folders.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns_hosts import Host, available, hosts
from user_project import IMPORTED, ROOT, user_project

from bench.chaos_checks import LearnerKill, delivery, version_violations
from streamrl.launch.status import read_steps
from streamrl.learner.checkpoint import latest, step_of
from streamrl.runtime.jsonl_log import commits_path, read_jsonl

PASSWORD = "multihost-test-password"
# steps the resumed learners run past the step they were killed at
RESUMED_STEPS = 4

why_not = available()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        why_not is not None and not os.environ.get("STREAMRL_REQUIRE_NETNS"),
        reason=f"several hosts need network namespaces: {why_not}",
    ),
]


def _wait(what: str, ok, timeout: float, procs=()) -> None:
    """Poll ``ok`` until true; fail naming ``what`` (a hang guard, not a speed bound)."""
    deadline = time.monotonic() + timeout
    while not ok():
        for name, proc in procs:
            assert proc.poll() is None, f"{name} exited ({proc.returncode}) waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


class Probe:
    """tests/multihost_probe.py on host A: the run's Redis state as a dict, on demand."""

    def __init__(self, host: Host, env: dict, run_name: str, cwd: Path):
        self.proc = host.popen(
            [sys.executable, "-u", str(ROOT / "tests" / "multihost_probe.py"),
             run_name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd,
            env={**env, "REDIS_URL": f"redis://:{PASSWORD}@{host.address}:6379/0"},
        )  # fmt: skip

    def __call__(self) -> dict:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        assert "error" not in out, out
        return out


def _pids(host: Host, needle: str) -> list[int]:
    """Processes on ``host`` whose command line contains ``needle``."""
    out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
    found = []
    for pid in out.stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(pid))
    return found


def _from_c(rows: list[dict]) -> bool:
    return any(a.startswith("C-") for r in rows for a in r.get("groups_by_actor", {}))


@pytest.mark.timeout(900)
def test_three_hosts_train_relay_weights_once_per_host_and_survive_kills_and_a_cut_link(
    tmp_path, demo_policy, demo_dataset
):
    if why_not is not None:  # STREAMRL_REQUIRE_NETNS (CI) makes a missing capability a failure
        pytest.fail(f"several hosts need network namespaces: {why_not}")
    project, env = user_project(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    streamrl = [str(Path(sys.executable).parent / "streamrl")]
    common = [
        "--config", "demo_cpu",
        f"run.dir={run_dir}", "run.name=multihost", "run.max_steps=100000", "run.max_time_s=0",
        f"model.path={demo_policy}", f"data.path={demo_dataset}",
        "weightsync.transport=dist", "weightsync.dist.relay=true", "weightsync.timeout_s=5",
        "learner.checkpoint_every=5", "learner.lr_scheduler=constant", "learner.commit_log=true", "actor.publish_log=true",
        "learner.cpus=null", "actor.cpus=null", "actor.staggered_start=false",
    ]  # fmt: skip
    secret = {**env, "STREAMRL_REDIS_PASSWORD": PASSWORD}
    join = "redis://A:6379/0"

    def learner(host: Host, rank: int, *extra: str) -> subprocess.Popen:
        argv = [*streamrl, "learner", "--join", join, "--nnodes", "2", "--node-rank", str(rank),
                "--rdzv-endpoint", "A:29400", "--max-restarts", "0", *common, *extra]  # fmt: skip
        log = open(tmp_path / f"learner{rank}-{len(host.procs)}.log", "w")
        return host.popen(argv, env=secret, cwd=project, stdout=log, stderr=subprocess.STDOUT)

    def logs() -> str:
        return "".join(f"\n--- {p.name}\n" + p.read_text()[-2500:] for p in tmp_path.glob("*.log"))

    with hosts() as h:
        a, b, c = h["A"], h["B"], h["C"]
        broker = a.popen(
            [*streamrl, "broker", *common, f"broker.host={a.address}", "broker.port=6379"],
            env=secret, cwd=project, stdout=open(tmp_path / "broker.log", "w"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        probe = Probe(a, env, "multihost", project)
        _wait("the broker", lambda: _try(probe), 60, [("broker", broker)])
        learners = [learner(a, 0), learner(b, 1)]
        actors_a = a.popen(
            [*streamrl, "actors", "--join", join, "--count", "1", *common], env=secret, cwd=project,
            stdout=open(tmp_path / "actorsA.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        actors_c = c.popen(
            [*streamrl, "actors", "--join", join, "--count", "2", *common], env=secret, cwd=project,
            stdout=open(tmp_path / "actorsC.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        alive = [("broker", broker), ("actors on A", actors_a), ("actors on C", actors_c)]
        everyone = alive + [("learner 0", learners[0]), ("learner 1", learners[1])]
        try:
            # 1. it trains; C's actors take new versions through C's relay
            _wait("C's actors on a new version", lambda: min(_c_versions(probe()), default=0) >= 3,
                  300, everyone)  # fmt: skip
            rx_before, relay_before = c.rx_bytes(), probe()["relay"]
            _wait("three more versions at C's relay",
                  lambda: probe()["relay"].get("C:versions", 0) >= relay_before["C:versions"] + 3,
                  120, everyone)  # fmt: skip
            relay = probe()["relay"]
            versions = relay["C:versions"] - relay_before["C:versions"]
            per_version = (relay["C:bytes"] - relay_before["C:bytes"]) / versions
            model_bytes = os.path.getsize(Path(demo_policy) / "model.safetensors")
            assert 0.45 * model_bytes <= per_version <= 1.05 * model_bytes, (
                per_version,
                model_bytes,
            )
            # what the link carried: one copy per version for the host's two actors, plus the
            # stream and Redis chatter; one copy per actor would be twice the model
            link_per_version = (c.rx_bytes() - rx_before) / versions
            assert link_per_version < 1.5 * per_version, (link_per_version, per_version)

            # 2. a SIGKILLed actor on C is restarted by C's supervisor and catches up
            killed = probe()
            victim = killed["actors"]["C-a0"]["pid"]
            os.kill(victim, signal.SIGKILL)

            def restarted_and_current() -> bool:
                me = probe()["actors"].get("C-a0", {})
                return me.get("pid", victim) != victim and me["version"] > killed["version"]

            _wait("C-a0 restarted on the current version", restarted_and_current, 240, everyone)

            # 3. C unplugged past weightsync.timeout_s: the learner trains on A's actor meanwhile
            c.link(False)
            cut_at = len(read_steps(run_dir))
            _wait("steps while C is cut off", lambda: len(read_steps(run_dir)) >= cut_at + 3,
                  240, [("learner 0", learners[0]), ("learner 1", learners[1])])  # fmt: skip
            c.link(True)
            back_at = len(read_steps(run_dir))
            _wait("C's actors training again after the cut",
                  lambda: _from_c(read_steps(run_dir)[back_at:]), 300, everyone)  # fmt: skip

            # 4. a killed learner node stops both; started again, they resume from the checkpoint
            _wait("a checkpoint after the cut", lambda: _latest_checkpoint(run_dir) > back_at, 300,
                  everyone)  # fmt: skip
            rows_before = len(read_steps(run_dir))
            workers = [p for p in _pids(b, "streamrl.learner") if p != learners[1].pid]
            assert workers, "no learner worker on B"
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            for proc in learners:
                proc.wait(timeout=180)
            assert learners[0].returncode != 0 and learners[1].returncode != 0
            checkpoint = _latest_checkpoint(run_dir)
            assert checkpoint >= 5
            stop_at = f"run.max_steps={rows_before + RESUMED_STEPS}"
            learners[:] = [learner(a, 0, stop_at), learner(b, 1, stop_at)]
            _wait("the resumed learners to finish", lambda: all(p.poll() is not None for p in learners),
                  600, alive)  # fmt: skip
            assert [p.returncode for p in learners] == [0, 0], logs()
            queued = set(probe()["queued"])
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs()}") from None
        finally:
            for proc in (actors_a, actors_c, broker):
                proc.send_signal(signal.SIGTERM)
            for proc in (actors_a, actors_c, broker):
                proc.wait(timeout=60)

    rows = read_steps(run_dir)
    assert rows[-1]["step"] == rows_before + RESUMED_STEPS
    assert not version_violations(rows, [LearnerKill(rows_before, checkpoint)])
    published = {}
    for path in (run_dir / "published").glob("*.jsonl"):
        published.update({r["group_id"]: r["entry_id"] for r in read_jsonl(path)})
    report = delivery(published, read_jsonl(commits_path(run_dir)), queued, wipes_ms=[])
    assert not report.lost and not report.committed_twice, report
    assert _from_c(rows) and any(a.startswith("A-") for r in rows for a in r["groups_by_actor"])
    assert IMPORTED not in logs()


def _try(probe: Probe) -> bool:
    try:
        probe()
    except AssertionError:
        return False
    return True


def _c_versions(snap: dict) -> list[int]:
    return [a["version"] for name, a in snap["actors"].items() if name.startswith("C-")]


def _latest_checkpoint(run_dir: Path) -> int:
    folder = latest(run_dir / "checkpoints")
    return 0 if folder is None else step_of(folder)
