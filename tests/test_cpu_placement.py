"""CPU placement: which cores the learner and the actors pin themselves to once started.

``launch.placement.cpu_sets`` is checked as a function of the config, the launcher's cores and
whether the host has GPUs; ``runtime.cpu_pinning.pin`` in a real process with a thread and a child
process, read back from /proc; the supervisor with real children: each child pins itself once ready, Redis and the launcher
leave the learner's cores while the run lasts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from streamrl.configs import Config, load_config
from streamrl.launch.placement import CpuSets, PlacementError, cpu_sets, nvidia_present

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only"
)

CONFIG = "configs/demo_cpu.yaml"


def _cfg(**sections) -> Config:
    return Config.model_validate(sections)


def _auto(**sections) -> Config:
    learner = {"cpus": "auto", **sections.pop("learner", {})}
    actor = {"cpus": "auto", **sections.pop("actor", {})}
    return _cfg(learner=learner, actor=actor, **sections)


def test_auto_gives_the_cpu_learner_its_own_cores_and_the_actors_the_rest():
    assert cpu_sets(_auto(), [0, 1], gpu_host=False) == CpuSets((0,), (1,))
    # indices count the launcher's own cores (taskset, cpusets), not the host's
    assert cpu_sets(_auto(), [4, 6, 7], gpu_host=False) == CpuSets((4,), (6, 7))
    two_ranks = _auto(learner={"ranks": 2}, run={"torch_threads": 2})
    assert cpu_sets(two_ranks, list(range(6)), gpu_host=False) == CpuSets((0, 1, 2, 3), (4, 5))


def test_auto_pins_nothing_without_a_core_to_spare_on_a_gpu_host_or_by_default():
    assert cpu_sets(_auto(), [0], gpu_host=False) == CpuSets(None, None)
    assert cpu_sets(_auto(learner={"ranks": 2}), [0, 1], gpu_host=False) == CpuSets(None, None)
    assert cpu_sets(_auto(), [0, 1], gpu_host=True) == CpuSets(None, None)
    assert cpu_sets(_cfg(), [0, 1], gpu_host=False) == CpuSets(None, None)
    # the actors take "the rest" only when the learner has cores of its own
    assert cpu_sets(_cfg(actor={"cpus": "auto"}), [0, 1], gpu_host=False) == CpuSets(None, None)


def test_explicit_lists_index_the_launchers_cores_and_auto_actors_take_the_rest():
    explicit = _cfg(learner={"cpus": [2]}, actor={"cpus": [0, 1]})
    assert cpu_sets(explicit, [3, 5, 8], gpu_host=True) == CpuSets((8,), (3, 5))
    rest = _cfg(learner={"cpus": [1]}, actor={"cpus": "auto"})
    assert cpu_sets(rest, [0, 1, 2], gpu_host=True) == CpuSets((1,), (0, 2))
    with pytest.raises(PlacementError, match=r"actor.cpus=\[0, 3\] names core index\(es\) \[3\]"):
        cpu_sets(_cfg(actor={"cpus": [0, 3]}), [0, 1, 2], gpu_host=False)


def test_auto_leaves_vllm_actors_to_place_their_own_threads():
    mixed = _auto(actor={"engines": ["hf", "vllm"]})
    sets = cpu_sets(mixed, [0, 1, 2], gpu_host=False)
    assert [sets.for_actor(mixed, i) for i in range(3)] == [(1, 2), None, (1, 2)]
    explicit = _cfg(learner={"cpus": [0]}, actor={"cpus": [1], "engine": "vllm"})
    assert cpu_sets(explicit, [0, 1], gpu_host=False).for_actor(explicit, 0) == (1,)
    assert sets.describe() == "learner: CPU 0 · actors: CPU 1,2"
    assert CpuSets(None, None).describe() == "learner: all · actors: all"


@pytest.mark.parametrize(
    ("sections", "names"),
    [
        ({"learner": {"cpus": []}}, ["learner.cpus=[]", "at least one CPU"]),
        ({"actor": {"cpus": [-1]}}, ["actor.cpus", "CPU indices must be >= 0"]),
        ({"actor": {"cpus": [1, 1]}}, ["actor.cpus", "twice"]),
        ({"learner": {"cpus": "some"}}, ["learner.cpus"]),
    ],
)
def test_a_bad_cpu_list_fails_at_load_naming_the_key(sections, names):
    with pytest.raises(ValidationError) as err:
        _cfg(**sections)
    assert all(n in str(err.value) for n in names), str(err.value)


def test_a_gpu_host_is_told_by_the_launchers_devices_or_the_drivers_files():
    assert nvidia_present(["0"]) is True
    assert nvidia_present([]) is False
    assert nvidia_present(None) == any(
        name.startswith("nvidia") and name[6:].isdigit() for name in os.listdir("/dev")
    )


def _allowed(pid: int) -> set[frozenset[int]]:
    """The distinct CPU sets of the threads of ``pid`` (a thread that ends meanwhile has none)."""
    sets = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            sets.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            continue
    return sets


def test_pin_moves_every_running_thread_and_child_process():
    first = min(os.sched_getaffinity(0))
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, threading
        from streamrl.runtime.cpu_pinning import pin
        gate = threading.Event()
        threading.Thread(target=gate.wait, daemon=True).start()
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        pin({{{first}}})
        print(child.pid, flush=True)
        sys.stdin.readline()
        child.stdin.close(); child.wait()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(proc.stdout.readline())
        parent_sets = _allowed(proc.pid)
        child_sets = _allowed(child)
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=60)
    assert threads >= 2
    assert parent_sets == {frozenset({first})}
    assert child_sets == {frozenset({first})}


def _wait_for(log: Path, text: str, proc: subprocess.Popen) -> None:
    """Until ``text`` is in ``log`` (readiness, not timing: the test's timeout bounds it)."""
    while not (log.exists() and text in log.read_text(errors="replace")):
        assert proc.poll() is None, f"{log.name}: exited {proc.returncode}\n{log.read_text()}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_supervisors_children_start_on_every_core_then_pin_themselves(
    tmp_path, demo_policy, demo_dataset
):
    from streamrl.launch.supervisor import Supervisor

    cores = sorted(os.sched_getaffinity(0))
    learner_core, actor_core = cores[0], cores[-1]
    cfg = load_config(
        CONFIG,
        [
            f"run.name=cpus-{uuid.uuid4().hex[:8]}",
            f"run.dir={tmp_path / 'run'}",
            f"model.path={demo_policy}",
            f"data.path={demo_dataset}",
            "learner.cpus=[0]",
            f"actor.cpus=[{len(cores) - 1}]",
        ],
        env={},
    )
    sup = Supervisor(cfg, actors=1)
    try:
        sup.start()
        learner, actor = sup.learner.proc, sup.actors[0].proc
        env = psutil.Process(learner.pid).environ()
        _wait_for(sup.learner.log, "pinned to CPU core(s)", learner)
        _wait_for(sup.actors[0].log, "pinned to CPU core(s)", actor)
        learner_sets = _allowed(learner.pid)
        actor_sets = _allowed(actor.pid)
        redis_sets = _allowed(sup.redis_server.proc.pid)
        launcher_sets = _allowed(os.getpid())
    finally:
        sup.stop()
    assert env["STREAMRL_CPUS"] == str(learner_core)
    assert learner_sets == {frozenset({learner_core})}
    assert actor_sets == {frozenset({actor_core})}
    assert redis_sets == launcher_sets == {frozenset({actor_core})}
    # stopped, the launcher runs where it ran before (a notebook that called streamrl.run)
    assert _allowed(os.getpid()) == {frozenset(cores)}
