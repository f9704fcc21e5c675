"""Short chaos rounds against the real system, then every invariant.

The soak (`make chaos`, bench/chaos.py) runs many seeded rounds; here one round
injects each random-moment fault once with AOF off, the harder case for
delivery (a Redis restart wipes queued work, and only that may be lost), and
two rounds with AOF on aim kills at the learner's windows (read but not counted;
mid-save; after the `latest` switch, before the ack) and SIGKILL Redis, so
`make test` exercises the whole harness and its invariants on every change.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import redis

from bench.chaos import AIMED, CONFIG, FAULTS, ChaosRound
from bench.chaos_checks import (
    AdmissionCounts,
    Delivery,
    LearnerKill,
    admission_violations,
    delivery,
    delivery_violations,
    read_not_counted,
    save_in_progress,
    version_violations,
)
from streamrl.broker.server import EmbeddedRedis
from streamrl.configs import load_config
from streamrl.launch.supervisor import Supervisor


def test_delivery_accounting_tells_wiped_lost_and_twice_committed_groups_apart():
    published = {"a": "100-0", "b": "200-0", "c": "300-0", "d": "400-0"}
    commits = [
        {"step": 3, "groups": ["a"]},
        {"step": 3, "groups": ["a"]},
        {"step": 6, "groups": ["b"]},
    ]
    d = delivery(published, commits, queued={"d"}, wipes_ms=[250])
    assert (d.committed_once, d.committed_twice, d.still_queued, d.lost, d.lost_to_wipes) == (
        2,
        [],
        1,
        ["c"],
        0,
    )
    assert delivery_violations(d, persistent=False) == [
        "1 lost group(s) were published after the last Redis wipe"
    ]
    assert delivery_violations(delivery(published, commits, {"d"}, [350]), persistent=False) == []
    assert (
        "lost with AOF"
        in delivery_violations(delivery(published, commits, {"d"}, []), persistent=True)[0]
    )
    twice = delivery(published, [*commits, {"step": 9, "groups": ["b"]}], {"c", "d"}, [])
    assert twice.committed_twice == ["b"] and delivery_violations(twice, True)
    assert isinstance(twice, Delivery)


def test_a_restarted_learner_must_resume_from_its_checkpoint_not_from_scratch():
    rows = [{"step": s, "version": s} for s in range(1, 7)]
    resumed = rows + [{"step": 4, "version": 4}, {"step": 5, "version": 5}]
    assert version_violations(resumed, [LearnerKill(rows_before=6, checkpoint_step=3)]) == []
    from_scratch = rows + [{"step": 1, "version": 1}]
    assert version_violations(from_scratch, [LearnerKill(6, 3)])
    backwards = [{"step": 1, "version": 2}, {"step": 2, "version": 1}]
    assert version_violations(backwards, [])


def test_rows_of_batches_without_an_update_do_not_count_as_versions_going_nowhere():
    rows = [{"step": 1, "version": 1}, {"step": 1, "version": 1, "trained": False}]
    assert version_violations([*rows, {"step": 2, "version": 2}], []) == []
    assert version_violations([*rows, {"step": 2, "version": 1}], [])


def test_admission_counters_must_account_for_every_accepted_group_once():
    balanced = AdmissionCounts(
        accepted=20, consumed=12, discarded=2, trimmed=1, live_leases=0, stream_length=5
    )
    assert admission_violations(balanced) == []
    # a read never counted: slots gone for good
    leaked = AdmissionCounts(20, 9, 2, 1, 0, 5)
    assert "unbalanced" in admission_violations(leaked)[0]
    assert admission_violations(AdmissionCounts(20, 12, 2, 1, 1, 5)) == [
        "1 admission lease(s) still live after a clean stop"
    ]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_system_recovers_from_each_fault_and_keeps_every_invariant(
    tmp_path, demo_policy, demo_dataset
):
    rng = random.Random(7)
    faults = list(FAULTS)
    rng.shuffle(faults)
    result = ChaosRound(0, rng, tmp_path, demo_policy, demo_dataset, faults, appendonly=False).run()
    print(f"round {result.seconds:.0f} s, {result.steps} steps: {result.faults}")
    assert [f.kind for f in result.faults] == faults
    assert all(f.recovery_s is not None for f in result.faults), result.faults
    assert result.violations == []
    d = result.delivery
    assert d.published > 0 and d.committed_once + d.still_queued + len(d.lost) == d.published


def test_the_aimed_windows_are_told_from_their_neighbours():
    # (consumed, pending): a read grows pending; a completed step then raises consumed; an ack
    # (after a checkpoint) shrinks pending
    assert read_not_counted((8, 4), (8, 8))
    assert not read_not_counted((8, 8), (12, 8)) and not read_not_counted((12, 8), (12, 0))
    assert not read_not_counted((8, 4), (12, 8))
    # a save of step 6 being written next to latest -> step 3; a re-save of step 6; none
    assert save_in_progress("step-00000003.0", ["step-00000003.0", "step-00000006.0"]) == (6, 0)
    assert save_in_progress("step-00000006.0", ["step-00000006.0", "step-00000006.1"]) == (6, 1)
    assert save_in_progress("step-00000006.0", ["step-00000003.0", "step-00000006.0"]) is None
    assert save_in_progress(None, ["step-00000003.0"]) == (3, 0)
    assert save_in_progress(None, []) is None


def test_the_supervisor_brings_a_sigkilled_embedded_redis_back_with_its_aof(tmp_path):
    overrides = [f"run.dir={tmp_path}", "run.name=redis-watch", "broker.appendonly=true"]
    sup = Supervisor(load_config(CONFIG, overrides, env={}))
    sup.log_dir.mkdir(parents=True)
    sup.redis_server = EmbeddedRedis(sup.cfg.broker, tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(sup.redis_server.url, socket_timeout=2)
        client.xadd("s", {"g": b"acked before the kill"})
        port, pid = sup.redis_server.port, sup.redis_server.proc.pid
        os.kill(pid, signal.SIGKILL)
        sup.redis_server.proc.wait(10)
        sup._watch_redis(time.monotonic())
        assert sup.redis_server.proc.pid != pid and sup.redis_server.port == port
        # same port and password: the old URL works, and the AOF gave the entry back
        assert [f for _, f in client.xrange("s")] == [{b"g": b"acked before the kill"}]
        assert "restarted on port" in sup.events[-1]
        client.close()
    finally:
        sup.redis_server.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "faults",
    [["kill_after_read", "kill_after_switch"], ["kill_in_save", "kill_redis"]],
    ids=["read-switch", "save-redis"],
)
def test_kills_aimed_at_the_windows_lose_nothing_and_train_nothing_twice(
    tmp_path, demo_policy, demo_dataset, faults
):
    """AOF on: with it not even a SIGKILLed Redis may lose an accepted group."""
    assert set(faults) <= set(AIMED)
    rng = random.Random(3)
    result = ChaosRound(0, rng, tmp_path, demo_policy, demo_dataset, faults, appendonly=True).run()
    print(f"round {result.seconds:.0f} s, {result.steps} steps: {result.faults}")
    assert [f.kind for f in result.faults] == faults
    assert all(f.recovery_s is not None for f in result.faults), result.faults
    assert result.violations == [], result.faults
    d = result.delivery
    assert d.published > 0 and not d.lost and d.committed_once + d.still_queued == d.published
