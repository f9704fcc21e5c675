"""GPU placement on a CPU host: fake device indices in, each child's CUDA_VISIBLE_DEVICES out.

The config checks (overlaps, one GPU per learner rank, indices) fail at load naming the key; the
supervisor starts the real learner and actors with the devices ``launch.placement`` computes,
read back from each child's /proc/<pid>/environ, and records them where the live view and
``streamrl inspect`` show them.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from streamrl.configs import Config, load_config
from streamrl.launch import placement
from streamrl.launch.placement import PlacementError, actor_gpus, check, visible_devices

CONFIG = "configs/demo_cpu.yaml"


def _cfg(**sections) -> Config:
    return Config.model_validate(sections)


def test_actors_take_their_gpus_round_robin_one_or_tensor_parallel_groups():
    cfg = _cfg(learner={"gpus": [0]}, actor={"gpus": [1, 2]})
    assert [actor_gpus(cfg, i) for i in range(5)] == [[1], [2], [1], [2], [1]]
    tp = _cfg(
        learner={"gpus": [0]},
        actor={"gpus": [4, 5, 6, 7], "engine": "vllm", "vllm": {"tensor_parallel_size": 2}},
    )
    assert [actor_gpus(tp, i) for i in range(3)] == [[4, 5], [6, 7], [4, 5]]
    assert actor_gpus(_cfg(), 3) is None


def test_under_cuda_ipc_an_actor_on_its_own_gpus_sees_the_learners_after_them():
    ipc = {"transport": "cuda_ipc"}
    cfg = _cfg(learner={"gpus": [0]}, actor={"gpus": [1, 2], "device": "cuda"}, weightsync=ipc)
    assert [actor_gpus(cfg, i) for i in range(3)] == [[1, 0], [2, 0], [1, 0]]
    tp = _cfg(
        learner={"gpus": [3]},
        actor={"gpus": [4, 5], "engine": "vllm", "vllm": {"tensor_parallel_size": 2}},
        weightsync=ipc,
    )
    assert actor_gpus(tp, 0) == [4, 5, 3]
    share = _cfg(learner={"gpus": [3]}, actor={"gpus": "share", "device": "cuda"}, weightsync=ipc)
    assert actor_gpus(share, 1) == [3]


def test_share_puts_every_actor_on_the_learners_gpu():
    cfg = _cfg(learner={"gpus": [3]}, actor={"gpus": "share"})
    assert [actor_gpus(cfg, i) for i in range(3)] == [[3], [3], [3]]
    assert actor_gpus(_cfg(actor={"gpus": "share"}), 0) == [0]


def test_indices_count_the_launchers_own_visible_devices():
    assert visible_devices([0, 2], None) == "0,2"
    assert visible_devices([0, 2], ["4", "5", "6"]) == "4,6"
    assert visible_devices([1], ["GPU-aa", "GPU-bb"]) == "GPU-bb"
    assert placement.launcher_devices({"CUDA_VISIBLE_DEVICES": "4, 5,6"}) == ["4", "5", "6"]
    assert placement.launcher_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert placement.launcher_devices({}) is None


@pytest.mark.parametrize(
    ("sections", "names"),
    [
        ({"learner": {"gpus": [0, 1]}}, ["learner.gpus", "learner.ranks=1", "one per rank"]),
        ({"learner": {"gpus": [0], "ranks": 2}}, ["learner.gpus", "learner.ranks=2"]),
        ({"learner": {"gpus": [-1]}}, ["learner.gpus", ">= 0"]),
        ({"actor": {"gpus": [1, 1]}}, ["actor.gpus", "twice"]),
        (
            {"actor": {"gpus": [1, 2, 3], "engine": "vllm", "vllm": {"tensor_parallel_size": 2}}},
            ["actor.gpus", "multiple"],
        ),
        ({"learner": {"ranks": 2}, "actor": {"gpus": "share"}}, ["share", "learner.ranks=2"]),
        (
            {"learner": {"gpus": [0]}, "actor": {"gpus": [1, 2], "device": "cuda:1"}},
            ["actor.device=cuda:1", "cuda:0..0"],
        ),
    ],
)
def test_a_bad_placement_fails_at_load_naming_the_key(sections, names):
    with pytest.raises(ValidationError) as err:
        _cfg(**sections)
    assert all(n in str(err.value) for n in names), str(err.value)


@pytest.mark.parametrize(
    ("sections", "names"),
    [
        (
            {"learner": {"gpus": [0]}, "actor": {"gpus": [1, 0]}},
            ["actor.gpus", "learner.gpus", "[0]"],
        ),
        # unplaced, the learner takes cuda:0
        ({"actor": {"gpus": [0, 1]}}, ["actor.gpus", "learner.gpus=None", "[0]"]),
    ],
)
def test_actors_on_the_learners_gpus_are_refused_where_both_run_not_on_an_actors_host(
    sections, names
):
    cfg = _cfg(**sections)
    with pytest.raises(PlacementError) as err:
        check(cfg, 4)
    assert all(n in str(err.value) for n in names), str(err.value)
    # `streamrl actors` on another host: the learner's GPU 0 is that host's, not this one's
    check(cfg, 4, learner_here=False)


def test_an_index_past_the_launchers_devices_is_refused_before_anything_starts():
    cfg = _cfg(learner={"gpus": [0]}, actor={"gpus": [1, 4]})
    with pytest.raises(PlacementError, match=r"actor.gpus=\[1, 4\] names GPU\(s\) \[4\].* sees 4"):
        check(cfg, 4)
    check(cfg, 5)
    with pytest.raises(PlacementError, match="share"):
        check(_cfg(actor={"gpus": "share"}), 0)
    shared_dist = _cfg(actor={"gpus": "share"}, weightsync={"transport": "dist"})
    with pytest.raises(PlacementError, match="NCCL.*weightsync.transport=shm"):
        check(shared_dist, 1)
    shared_dist.weightsync.dist.backend = "gloo"
    check(shared_dist, 1)
    # the launcher's CUDA_VISIBLE_DEVICES is what it sees, whatever the host has
    with pytest.raises(PlacementError, match="sees 1 GPU"):
        placement.check_launcher(_cfg(learner={"gpus": [1]}), ["3"])
    placement.check_launcher(_cfg(learner={"gpus": [1]}), ["3", "5"])
    placement.check_launcher(_cfg(), [])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_supervisor_starts_each_child_with_its_own_devices_and_records_them(
    tmp_path, demo_policy, demo_dataset, monkeypatch, capsys
):
    from streamrl.launch.cli import main
    from streamrl.launch.status import Snapshot
    from streamrl.launch.supervisor import Supervisor
    from streamrl.launch.view import live_table

    # four fake GPUs, named by the launcher's own CUDA_VISIBLE_DEVICES: index i is "9i"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "90,91,92,93")
    overrides = [
        f"run.name=place-{uuid.uuid4().hex[:8]}",
        f"run.dir={tmp_path / 'run'}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        "learner.gpus=[3]",
        "actor.gpus=[0,2]",
        # every actor at once, so that each one's devices are there to read
        "actor.staggered_start=false",
    ]
    cfg = load_config(CONFIG, overrides, env={})
    sup = Supervisor(cfg, actors=3)
    try:
        sup.start()
        envs = {c.name: psutil.Process(c.proc.pid).environ() for c in [sup.learner, *sup.actors]}
        recorded = json.loads((Path(cfg.run.dir) / placement.PLACEMENT_FILE).read_text())
        sup.scale(2)
        after_scale = placement.read(cfg.run.dir)
        assert main(["inspect", "--config", CONFIG, *overrides]) == 0
        shown = capsys.readouterr().out
    finally:
        sup.stop()
    devices = {name: env["CUDA_VISIBLE_DEVICES"] for name, env in envs.items()}
    assert devices == {"learner": "93", "a0": "90", "a1": "92", "a2": "90"}
    assert all(env["REDIS_URL"] for env in envs.values())
    assert recorded == devices
    assert after_scale == {"learner": "93", "a0": "90", "a1": "92"}
    assert "GPUs (CUDA_VISIBLE_DEVICES): learner: GPU 93 · a0: GPU 90 · a1: GPU 92" in shown

    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(live_table(Snapshot(at=0.0), 1.0, [], sup.placement))
    assert "learner: GPU 93 · a0: GPU 90 · a1: GPU 92" in console.export_text()


def test_without_placement_children_inherit_and_the_view_shows_no_gpu_row():
    from rich.console import Console

    from streamrl.launch.status import Snapshot
    from streamrl.launch.view import live_table

    console = Console(record=True, width=200)
    console.print(live_table(Snapshot(at=0.0), 1.0, [], {"learner": None, "a0": None}))
    assert "GPUs" not in console.export_text()
