"""A short real run: Redis + learner + actor processes under the supervisor of `make run`.

One test, several properties, because starting the system is the expensive
part: the reward rises and versions advance, actors pick up new weights in the
middle of completions, a SIGKILLed actor is restarted and nothing the broker
accepted is lost, an actor added mid-run contributes, and a clean shutdown
leaves no process and no shared-memory segment behind.
"""

from __future__ import annotations

import os
import signal
import statistics
import uuid
from pathlib import Path

import pytest

from broker.keys import Keys
from broker.wire import decode_group
from configs import load_config
from launch.status import read_steps
from launch.supervisor import Supervisor
from weightsync.shm import SHM_DIR, segment_prefix

CONFIG = "configs/demo_cpu.yaml"


def _groups(redis, keys: Keys) -> list[tuple[bytes, object]]:
    return [(entry_id, decode_group(fields[b"g"])) for entry_id, fields in redis.xrange(keys.stream)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_short_run_learns_survives_a_killed_actor_scales_and_stops_clean(tmp_path, demo_policy, demo_dataset):
    run_name = f"e2e-{uuid.uuid4().hex[:8]}"
    overrides = [
        f"run.name={run_name}",
        f"run.dir={tmp_path / 'run'}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        "run.max_steps=40",
        "run.max_time_s=0",
        "learner.checkpoint_every=10",
    ]
    cfg = load_config(CONFIG, overrides, env={})
    keys = Keys.from_config(cfg)
    run_dir = Path(cfg.run.dir)
    sup = Supervisor(cfg, CONFIG, overrides, actors=2)
    pids: list[int] = []
    try:
        sup.start()
        assert sup.wait_until(lambda: len(read_steps(run_dir)) >= 5, timeout=180), "learner made no progress"

        victim = sup.actors[0]
        pids.append(victim.proc.pid)
        os.kill(victim.proc.pid, signal.SIGKILL)
        assert sup.wait_until(lambda: victim.restarts >= 1 and victim.alive, timeout=60), "killed actor not restarted"

        sup.scale(3)
        newcomer = sup.actors[-1].name
        assert sup.wait_until(
            lambda: any(g.actor_id == newcomer for _, g in _groups(sup.redis, keys)), timeout=120
        ), "an actor added mid-run published nothing"

        assert sup.wait_until(lambda: sup.learner_finished, timeout=240), "the run did not reach max_steps"
        pids += [c.proc.pid for c in [sup.learner, *sup.actors] if c.proc is not None]

        groups = _groups(sup.redis, keys)
        trained = {m.decode() for m in sup.redis.smembers(keys.trained)}
        pending = {e[0] if isinstance(e, (list, tuple)) else e["message_id"] for e in
                   sup.redis.xpending_range(keys.stream, cfg.broker.consumer_group, "-", "+", 10_000)}
        info = {g[b"name"].decode(): g for g in sup.redis.xinfo_groups(keys.stream)}
        last_delivered = info[cfg.broker.consumer_group][b"last-delivered-id"]
    finally:
        sup.stop()

    steps = read_steps(run_dir)
    assert steps[-1]["version"] >= 40
    assert [s["version"] for s in steps] == sorted(s["version"] for s in steps), "versions went backwards"
    first = statistics.fmean(s["reward_mean"] for s in steps[:5])
    last = statistics.fmean(s["reward_mean"] for s in steps[-5:])
    assert last > first + 0.1, f"reward did not rise: {first:.3f} -> {last:.3f}"

    # Actors swapped weights between decode steps: some completions span two versions.
    spans = [c for _, g in groups for c in g.completions if c.versions[0] != c.versions[-1]]
    assert max(int(c.versions.max()) for _, g in groups for c in g.completions) > 0
    assert spans, "no completion was generated across a weight update"

    # Nothing the broker accepted is lost: every entry is trained, pending, or not yet delivered.
    def key(entry_id: bytes) -> tuple[int, int]:
        ms, seq = entry_id.decode().split("-")
        return int(ms), int(seq)

    for entry_id, group in groups:
        assert group.group_id in trained or entry_id in pending or key(entry_id) > key(last_delivered), group.group_id

    for pid in pids:
        assert not _alive(pid), f"process {pid} outlived the shutdown"
    assert not list(SHM_DIR.glob(segment_prefix(run_name) + "*")), "shared memory leaked"
