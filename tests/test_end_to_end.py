"""A short real run: Redis + learner + actor processes under the supervisor of `make run`.

One test, several properties, because starting the system is the expensive
part: the reward rises and versions advance, actors pick up new weights while
they run, a SIGKILLed actor is restarted and nothing the broker
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
import recipes

from bench.chaos_checks import delivery
from streamrl.broker.keys import Keys
from streamrl.broker.wire import decode_group
from streamrl.configs import Config, load_config
from streamrl.launch.status import read_steps
from streamrl.launch.supervisor import Supervisor
from streamrl.runtime.jsonl_log import commits_path, published_path, read_jsonl
from streamrl.weightsync.transports.shm.segment import SHM_DIR, segment_prefix

CONFIG = "configs/demo_cpu.yaml"
STEPS = 80
# The demo preset's full-weight recipe at a constant LR (tests/recipes.py), as the threshold
# below was measured; under lr_scheduler auto the LR decayed to 0 over the 80 steps.
RECIPE = recipes.DEMO | {"run.max_steps": STEPS}
# The reward rise between the means of the first and the last WINDOW steps. Measured 2026-11-29
# on the 2-core machine under load (other helpers' pytest sessions, load average 1-8), n=6 runs
# of this test (kill, restart and scale included): +0.129, +0.132, +0.148, +0.139, +0.156,
# +0.142; mean +0.141, sd 0.010. RISE sits 9 sd below the mean (0.10 would be 4.1 sd).
WINDOW = 5
RISE = 0.05


def _queued_group_ids(redis, keys: Keys) -> set[str]:
    """Groups still in the stream: acked entries are deleted, so these were not trained yet."""
    return {decode_group(fields[b"g"]).group_id for _, fields in redis.xrange(keys.stream)}


def _contributed(run_dir: Path, actor_id: str) -> bool:
    return any(actor_id in s.get("groups_by_actor", {}) for s in read_steps(run_dir))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _config(tmp_path: Path, policy: str = "policy", dataset: str = "data.jsonl") -> Config:
    overrides = [
        f"run.name=e2e-{uuid.uuid4().hex[:8]}",
        f"run.dir={tmp_path / 'run'}",
        f"model.path={policy}",
        f"data.path={dataset}",
        # long enough for an actor scaled in after a kill and a restart to contribute
        *recipes.overrides(RECIPE),
        "learner.checkpoint_every=10",
        "actor.publish_log=true",
        "learner.commit_log=true",
    ]
    return load_config(CONFIG, overrides, env={})


def learning_configs(tmp_path: Path) -> dict[str, Config]:
    """The config this module's learning assertion trains with (tests/recipes.py)."""
    return {"e2e": _config(tmp_path)}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_short_run_learns_survives_a_killed_actor_scales_and_stops_clean(
    tmp_path, demo_policy, demo_dataset
):
    cfg = _config(tmp_path, demo_policy, demo_dataset)
    run_name = cfg.run.name
    keys = Keys.from_config(cfg.run, cfg.broker)
    run_dir = Path(cfg.run.dir)
    sup = Supervisor(cfg, actors=2)
    pids: list[int] = []
    try:
        sup.start()
        assert sup.wait_until(lambda: len(read_steps(run_dir)) >= 5, timeout=180), (
            "learner made no progress"
        )

        victim = sup.actors[0]
        pids.append(victim.proc.pid)
        os.kill(victim.proc.pid, signal.SIGKILL)
        assert sup.wait_until(lambda: victim.restarts >= 1 and victim.alive, timeout=60), (
            "killed actor not restarted"
        )

        sup.scale(3)
        newcomer = sup.actors[-1].name
        assert sup.wait_until(lambda: _contributed(run_dir, newcomer), timeout=120), (
            "an actor added mid-run trained nothing"
        )

        assert sup.wait_until(lambda: sup.learner_finished, timeout=240), (
            "the run did not reach max_steps"
        )
        pids += [c.proc.pid for c in [sup.learner, *sup.actors] if c.proc is not None]
        queued = _queued_group_ids(sup.redis, keys)
    finally:
        sup.stop()

    steps = read_steps(run_dir)
    assert steps[-1]["step"] >= STEPS
    versions = [s["version"] for s in steps]
    assert versions == sorted(versions), "versions went backwards"
    first = statistics.fmean(s["reward_mean"] for s in steps[:WINDOW])
    last = statistics.fmean(s["reward_mean"] for s in steps[-WINDOW:])
    assert last > first + RISE, f"reward did not rise: {first:.3f} -> {last:.3f}"

    # Actors picked up new weights while running: the last steps trained tokens sampled by versions
    # far above 0 (token version = learner version - staleness). Swaps *inside* a completion are
    # pinned exactly by tests/test_actors_engine.py; here they depend on timing.
    assert all(s["version"] - s["staleness_mean"] >= s["version"] / 2 for s in steps[-5:]), steps[
        -5:
    ]

    # Nothing the broker accepted is lost, nothing is trained twice (audit logs of actors and learner).
    published = {}
    for actor in {c.name for c in sup.actors} | {c.name for c in sup.retired}:
        published.update(
            {r["group_id"]: r["entry_id"] for r in read_jsonl(published_path(run_dir, actor))}
        )
    report = delivery(published, read_jsonl(commits_path(run_dir)), queued, wipes_ms=[])
    assert report.published > STEPS * cfg.learner.groups_per_step // 2
    assert not report.lost and not report.committed_twice, report

    for pid in pids:
        assert not _alive(pid), f"process {pid} outlived the shutdown"
    assert not list(SHM_DIR.glob(segment_prefix(run_name) + "*")), "shared memory leaked"
